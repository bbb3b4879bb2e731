// Backoff: delays grow by the multiplier up to the cap, stay within the jitter, and start over
// after Reset().
#include <catch2/catch.hpp>

#include <chrono>

#include "base/backoff.h"

using namespace std::chrono;

TEST_CASE("backoff grows to its cap within its jitter and resets", "[backoff]") {
  crun::Backoff b(milliseconds(5), seconds(1), 1.5, 0.2, 7);
  double base = 5000;  // microseconds
  for (int i = 0; i < 30; ++i) {
    const double d = static_cast<double>(b.Next().count());
    INFO("attempt " << i << ": " << d << " us, base " << base);
    CHECK(d >= base * 0.8 - 1);
    CHECK(d <= base * 1.2 + 1);
    base = std::min(base * 1.5, 1e6);
  }
  b.Reset();
  const auto first = b.Next();
  CHECK(first >= microseconds(3999));
  CHECK(first <= microseconds(6001));
  crun::Backoff none(milliseconds(10), milliseconds(10), 2, 0, 1);
  CHECK(none.Next() == milliseconds(10));
  CHECK(none.Next() == milliseconds(10));
}
