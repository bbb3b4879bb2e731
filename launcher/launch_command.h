// `crun [options] script [args...]`: the torchrun-compatible launcher on one node
// (docs/cli.md). Returns the process exit code: 0, the root cause's code, 128 + signal, or 2
// for bad input (with a message naming the value; nothing is started).
#pragma once

namespace crun::launcher {

int RunLaunch(int argc, char** argv);

}  // namespace crun::launcher
