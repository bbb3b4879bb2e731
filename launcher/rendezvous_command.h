// `crun rendezvous`: the long-lived rendezvous daemon (many run ids at once), and
// `crun status`: what a rendezvous service knows about its jobs.
#pragma once

#include <CLI/CLI.hpp>

#include "base/endpoint.h"
#include "base/security.h"
#include "launcher/backends/backend.h"

namespace crun::launcher {

void AddRendezvousCommand(CLI::App& app, int* exit_code);
void AddStatusCommand(CLI::App& app, int* exit_code, const Backends& backends = DefaultBackends());

}  // namespace crun::launcher
