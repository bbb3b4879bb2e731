// The one number parser every flag, variable and config key goes through: tables of what it
// reads and what it refuses.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>

#include "base/numbers.h"

using crun::ParseInteger;
using crun::ParseNumber;

TEST_CASE("integers: the whole text, in range, decimal", "[numbers]") {
  struct Row {
    const char* text;
    std::int64_t value;
  };
  for (const Row& row :
       {Row{"0", 0}, Row{"12", 12}, Row{"-3", -3}, Row{"65535", 65535}, Row{"007", 7}}) {
    INFO(row.text);
    CHECK(ParseInteger(row.text, -10, 70000) == row.value);
  }
  for (const char* bad : {"", " 1", "1 ", "+1", "1x", "0x10", "1e3", "1.0", "-", "--1",
                          "99999999999999999999", "70001", "-11"}) {
    INFO(bad);
    CHECK_FALSE(ParseInteger(bad, -10, 70000).has_value());
  }
  const auto max = std::numeric_limits<std::int64_t>::max();
  CHECK(ParseInteger("9223372036854775807", 0, max) == max);
  CHECK_FALSE(ParseInteger("9223372036854775808", 0, max).has_value());
}

TEST_CASE("numbers: finite, in range, nothing after them", "[numbers]") {
  CHECK(ParseNumber("0.5", 0, 1) == 0.5);
  CHECK(ParseNumber("30", 0, 100) == 30.0);
  CHECK(ParseNumber("1e-3", 0, 1) == 0.001);
  CHECK(ParseNumber("-2", -5, 5) == -2.0);
  for (const char* bad :
       {"", "nan", "inf", "-inf", "1s", " 1", "1 ", "0x1p3", "1e999", "2", "-0.1", ","}) {
    INFO(bad);
    CHECK_FALSE(ParseNumber(bad, 0, 1).has_value());
  }
}
