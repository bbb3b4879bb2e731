#include "base/numbers.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace crun {

std::optional<std::int64_t> ParseInteger(std::string_view text, std::int64_t min,
                                         std::int64_t max) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value, 10);
  if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) {
    return std::nullopt;
  }
  return value;
}

std::optional<double> ParseNumber(std::string_view text, double min, double max) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value, std::chars_format::general);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value) || value < min ||
      value > max) {
    return std::nullopt;
  }
  return value;
}

std::optional<std::uint64_t> ParseByteSize(std::string_view text) {
  constexpr std::int64_t kMax = std::int64_t{1} << 62;
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const auto number = ParseInteger(text.substr(0, digits), 0, kMax);
  if (!number) return std::nullopt;
  std::string_view unit = text.substr(digits);
  if (unit.size() == 3 && unit.substr(1) == "iB") unit = unit.substr(0, 1);
  int shift = 0;
  if (unit == "K")
    shift = 10;
  else if (unit == "M")
    shift = 20;
  else if (unit == "G")
    shift = 30;
  else if (unit == "T")
    shift = 40;
  else if (!unit.empty())
    return std::nullopt;
  if (*number > (kMax >> shift)) return std::nullopt;
  return static_cast<std::uint64_t>(*number) << shift;
}

std::string FormatBytes(std::uint64_t bytes) {
  char text[32];
  const double b = static_cast<double>(bytes);
  if (bytes < (1u << 10)) {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  } else if (bytes < (1u << 20)) {
    std::snprintf(text, sizeof text, "%.1f KiB", b / 1024);
  } else if (bytes < (1ull << 30)) {
    std::snprintf(text, sizeof text, "%.1f MiB", b / (1 << 20));
  } else if (bytes < (1ull << 40)) {
    std::snprintf(text, sizeof text, "%.2f GiB", b / (1ull << 30));
  } else {
    std::snprintf(text, sizeof text, "%.2f TiB", b / (1ull << 40));
  }
  return text;
}

}  // namespace crun
