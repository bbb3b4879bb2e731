// The SDK's public name for rendezvous/store/store.h. In the build tree it forwards to that
// header, the one crun's own code includes; `cmake --install` puts rendezvous/store/store.h
// itself here, its includes rewritten to crun/... (worker_sdk's CMakeLists.txt).
#pragma once

#include "rendezvous/store/store.h"
