// `crun [options] script [args...]`: the torchrun-compatible launcher on one node
// (docs/cli.md). Returns the process exit code: 0, the root cause's code, 128 + signal, or 2
// for bad input (with a message naming the value; nothing is started).
#pragma once

#include "launcher/backends/backend.h"

namespace crun::launcher {

// `backends`: the --rdzv-backend table (tests add a test-only entry to crun's own).
int RunLaunch(int argc, char** argv, const Backends& backends = DefaultBackends());

}  // namespace crun::launcher
