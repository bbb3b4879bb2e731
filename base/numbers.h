// Strict parsing of numbers that people type (flags, environment variables, config keys): the
// whole text must be the number, in range, and finite. No locale, no exceptions, no silent
// clamping; callers turn an empty optional into a message that quotes the value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace crun {

// A decimal integer in [min, max]: "12", "-3". Not "", " 1", "+1", "1x", "0x10", "1e3".
std::optional<std::int64_t> ParseInteger(std::string_view text, std::int64_t min, std::int64_t max);

// A finite decimal number in [min, max]: "0.5", "30", "1e-3". Not nan, inf, "", "1s".
std::optional<double> ParseNumber(std::string_view text, double min, double max);

// A number of bytes: a whole number with an optional binary unit, K, M, G or T (also KiB, MiB,
// GiB, TiB): "512", "64M", "8G", "1TiB". Not "", "1.5G", "8GB", "-1G"; at most 2^62.
std::optional<std::uint64_t> ParseByteSize(std::string_view text);

// A number of bytes for people to read, in the largest binary unit below it: "512 B",
// "1.5 KiB", "200.0 MiB", "1.00 GiB", "3.25 TiB".
std::string FormatBytes(std::uint64_t bytes);

}  // namespace crun
