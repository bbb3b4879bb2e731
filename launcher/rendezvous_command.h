// `crun rendezvous`: the long-lived rendezvous daemon (many run ids at once), and
// `crun status`: what a rendezvous service knows about its jobs.
#pragma once

#include <CLI/CLI.hpp>

#include "base/endpoint.h"
#include "base/security.h"

namespace crun::launcher {

void AddRendezvousCommand(CLI::App& app, int* exit_code);
void AddStatusCommand(CLI::App& app, int* exit_code);

}  // namespace crun::launcher
