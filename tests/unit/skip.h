// Skipping a unit-test case that cannot run on this machine (no GPU, no name server): the
// process ends with kSkipped, which ctest reports as skipped (crun_unit_test's SKIPPABLE sets
// SKIP_RETURN_CODE), never as passed. Under ctest each case runs in a process of its own.
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
