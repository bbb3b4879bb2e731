// Sampling for events that can come in floods (refused connections, refused calls).
#pragma once

#include <cstdint>

namespace crun {

// Whether the n-th occurrence (counting from 1) is worth a log line: the first ten, then each
// power of two, so that a storm stays visible without flooding the log.
inline bool WorthLogging(std::uint64_t n) { return n <= 10 || (n & (n - 1)) == 0; }

}  // namespace crun
