// Small whole-file writes: crun's own files (crun.pid, hang.json, failure.json, stacks).
#pragma once

#include <string>

namespace crun {

// Creates or truncates `path` (mode 0644) and writes `text`; false when it did not all get
// there or the file could not be closed.
bool WriteWholeFile(const std::string& path, const std::string& text);

}  // namespace crun
