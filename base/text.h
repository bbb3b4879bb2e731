// Small text helpers shared by the parsers of files and tool output (sysfs, nvidia-smi, py-spy
// and gdb stacks, token files). Whitespace here is ' ', '\t', '\r' and '\n'.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace crun {

// `s` without whitespace at either end.
std::string_view Trim(std::string_view s);
// `s` without whitespace at its end (a line read from a file, a token).
std::string_view TrimEnd(std::string_view s);
// The lines of `text`, without their '\n'; a last line without one counts too.
std::vector<std::string> SplitLines(std::string_view text);

}  // namespace crun
