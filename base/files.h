// Small whole-file writes: crun's own files (crun.pid, hang.json, failure.json, stacks).
#pragma once

#include <string>

namespace crun {

// Creates or truncates `path` (mode 0644) and writes `text`; false when it did not all get
// there or the file could not be closed.
bool WriteWholeFile(const std::string& path, const std::string& text);
// The same through a file beside it renamed over `path`: a reader sees the old text or the
// new, never part of one. False, and nothing left beside it, when it did not get there.
bool ReplaceWholeFile(const std::string& path, const std::string& text);

// The first executable `dir/name` of the absolute directories in `path` (a PATH value); ""
// when there is none.
std::string FindOnPath(const std::string& name, const std::string& path);

}  // namespace crun
