// `crun stacks`: the stacks of every rank of a running job, read without stopping it, grouped
// by where the ranks are (docs/hangs.md).
//   crun stacks PID             the crun launcher with that pid (this host)
//   crun stacks --log-dir DIR   the crun whose logs are under DIR (its --log-dir or below)
//   crun stacks --rdzv-endpoint H:P --rdzv-id ID
//                               every node of a multi-node job, through its rendezvous service
#pragma once

#include <CLI/CLI.hpp>

namespace crun::launcher {

void AddStacksCommand(CLI::App& app, int* exit_code);

}  // namespace crun::launcher
