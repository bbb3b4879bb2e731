// The security flags every command that speaks to crun's rendezvous service takes (crun's
// launch, `crun rendezvous`, `crun status`, `crun stacks`): docs/security.md.
#pragma once

#include <CLI/CLI.hpp>

#include "base/security.h"

namespace crun::launcher {

// --token-file, --tls-cert, --tls-key, --tls-ca, in a "Security" group.
void AddSecurityFlags(CLI::App* app, crun::SecurityFlags* flags);

}  // namespace crun::launcher
