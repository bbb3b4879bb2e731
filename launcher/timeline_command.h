// `crun timeline FILE [-o OUT]`: the goodput timeline (rendezvous/goodput/timeline.h) of a
// --goodput-file, as a self-contained HTML page: OUT, or FILE with .html for .json.
#pragma once

#include <CLI/CLI.hpp>

namespace crun::launcher {

void AddTimelineCommand(CLI::App& app, int* exit_code);

}  // namespace crun::launcher
