#include "base/text.h"

namespace crun {
namespace {

constexpr std::string_view kSpace = " \t\r\n";

}  // namespace

std::string_view Trim(std::string_view s) {
  const auto first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return TrimEnd(s.substr(first));
}

std::string_view TrimEnd(std::string_view s) {
  const auto last = s.find_last_not_of(kSpace);
  return last == std::string_view::npos ? std::string_view() : s.substr(0, last + 1);
}

std::vector<std::string> SplitLines(std::string_view text) {
  std::vector<std::string> lines;
  while (!text.empty()) {
    const auto end = text.find('\n');
    lines.emplace_back(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return lines;
}

}  // namespace crun
