// The SDK's public name for base/status.h. In the build tree it forwards to that header, the one
// crun's own code includes; `cmake --install` puts base/status.h itself here (worker_sdk's
// CMakeLists.txt), so that everything installed lives under include/crun/ and a user's own
// base/status.h never collides with crun's.
#pragma once

#include "base/status.h"
