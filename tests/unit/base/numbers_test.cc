// The one number parser every flag, variable and config key goes through: tables of what it
// reads and what it refuses; and byte sizes written back for people.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>

#include "base/numbers.h"

using crun::FormatBytes;
using crun::ParseByteSize;
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

TEST_CASE("byte sizes: whole numbers with binary units", "[numbers]") {
  CHECK(ParseByteSize("512") == 512u);
  CHECK(ParseByteSize("64K") == 64u << 10);
  CHECK(ParseByteSize("64KiB") == 64u << 10);
  CHECK(ParseByteSize("8G") == std::uint64_t{8} << 30);
  CHECK(ParseByteSize("1TiB") == std::uint64_t{1} << 40);
  CHECK(ParseByteSize("4194304T") == std::uint64_t{1} << 62);
  for (const char* bad : {"", "G", "1.5G", "8GB", "8g", "-1G", " 1G", "1 G", "8Gi", "4194305T"}) {
    INFO(bad);
    CHECK_FALSE(ParseByteSize(bad).has_value());
  }
}

TEST_CASE("byte sizes in words: the largest unit below them", "[numbers]") {
  CHECK(FormatBytes(0) == "0 B");
  CHECK(FormatBytes(1023) == "1023 B");
  CHECK(FormatBytes(1536) == "1.5 KiB");
  CHECK(FormatBytes(200u << 20) == "200.0 MiB");
  CHECK(FormatBytes(std::uint64_t{1} << 30) == "1.00 GiB");
  CHECK(FormatBytes(std::uint64_t{13} << 38) == "3.25 TiB");
}
