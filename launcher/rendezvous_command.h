// `crun rendezvous`: the long-lived rendezvous daemon (many run ids at once), and
// `crun status`: what a rendezvous service knows about its jobs.
#pragma once

#include <CLI/CLI.hpp>

#include "rendezvous/store/security.h"

namespace crun::launcher {

void AddRendezvousCommand(CLI::App& app, int* exit_code);
void AddStatusCommand(CLI::App& app, int* exit_code);

// "host", "host:port", "[v6]:port", "v6" -> host and port (default_port when absent).
struct Endpoint {
  std::string host;
  std::uint16_t port = 0;
};
// --token-file, --tls-cert, --tls-key, --tls-ca (docs/security.md), in a "Security" group.
void AddSecurityFlags(CLI::App* app, crun::SecurityFlags* flags);

bool ParseEndpoint(const std::string& text, std::uint16_t default_port, Endpoint* out,
                   std::string* error);

}  // namespace crun::launcher
