// Logging set-up for crun's commands: one stderr logger, lines tagged with the command, that
// never blocks the thread that logs (launcher/logging.cc, base/fd_writer.h).
#pragma once

#include <string>

namespace crun::launcher {

// `level` is one of trace, debug, info, warn, error, off (validated by the CLI).
void SetUpLogging(const std::string& command, const std::string& level);

// Waits until everything crun queued for its stdout and stderr is written: before it exits.
void FlushOutput();

}  // namespace crun::launcher
