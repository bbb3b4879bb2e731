// Logging set-up for crun's commands: one stderr logger, lines tagged with the command.
#pragma once

#include <string>

namespace crun::launcher {

// `level` is one of trace, debug, info, warn, error, off (validated by the CLI).
void SetUpLogging(const std::string& command, const std::string& level);

}  // namespace crun::launcher
