// base/text.h as a table: what each trim keeps.
#include <catch2/catch.hpp>

#include "base/text.h"

TEST_CASE("Trim and TrimEnd remove spaces, tabs, CR and LF at the ends, nothing inside") {
  struct Row {
    std::string_view in, trim, trim_end;
  };
  const Row rows[] = {
      {"", "", ""},
      {" \t\r\n", "", ""},
      {"a", "a", "a"},
      {"  a b\t", "a b", "  a b"},
      {"\ttoken\r\n", "token", "\ttoken"},
      {"x \n y", "x \n y", "x \n y"},
  };
  for (const Row& r : rows) {
    INFO(r.in);
    CHECK(crun::Trim(r.in) == r.trim);
    CHECK(crun::TrimEnd(r.in) == r.trim_end);
  }
}

TEST_CASE("SplitLines takes each line without its newline, the last even without one") {
  using Lines = std::vector<std::string>;
  CHECK(crun::SplitLines("") == Lines{});
  CHECK(crun::SplitLines("a") == Lines{"a"});
  CHECK(crun::SplitLines("a\n") == Lines{"a"});
  CHECK(crun::SplitLines("a\n\nb") == Lines{"a", "", "b"});
  CHECK(crun::SplitLines("\n") == Lines{""});
}
