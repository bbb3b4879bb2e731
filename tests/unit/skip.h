// Skipping a unit-test case that cannot run on this machine (no GPU, no name server): the
// process ends with kSkipped, which ctest reports as skipped, never as passed. A case that may
// skip carries the tag [may-skip]: crun_unit_test (tests/CMakeLists.txt) runs each such case
// in a process of its own with SKIP_RETURN_CODE, and the others together in one entry a
// binary, which fails (exit 77 is not a pass there) if an untagged case skips.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace crun::testing {

inline constexpr int kSkipped = 77;

[[noreturn]] inline void Skip(const char* why) {
  std::fprintf(stderr, "SKIPPED: %s\n", why);
  std::fflush(stderr);
  std::_Exit(kSkipped);
}

}  // namespace crun::testing
