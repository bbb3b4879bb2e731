// `crun store`: a standalone c10d-compatible store server, e.g. as the MASTER_ADDR:MASTER_PORT
// store for jobs launched by other means. Runs until SIGTERM or SIGINT, then closes every
// connection and exits 0.
#pragma once

#include <CLI/App.hpp>

namespace crun::launcher {

// Adds the `store` subcommand to `app`; `*exit_code` is set when it ran.
void AddStoreCommand(CLI::App& app, int* exit_code);

}  // namespace crun::launcher
