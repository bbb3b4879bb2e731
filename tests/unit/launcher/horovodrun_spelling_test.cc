// horovodrun's spelling on one host, as tables: its command line in, crun's out.
#include <catch2/catch.hpp>

#include "launcher/horovodrun_spelling.h"

using crun::launcher::RewriteHorovodrunSpelling;
using Args = std::vector<std::string>;

namespace {

bool Here(const std::string& host) { return host == "localhost" || host == "box"; }

}  // namespace

TEST_CASE("horovodrun spelling: -np and -H become crun's options", "[horovodrun]") {
  const struct {
    Args in, out;
  } cases[] = {
      {{"-np", "4", "python", "train.py"},
       {"--contract", "horovod", "--nproc-per-node", "4", "--no-python", "python", "train.py"}},
      {{"-np", "2", "-H", "localhost:4", "python", "t.py", "-np", "9"},
       {"--contract", "horovod", "--nproc-per-node", "2", "--no-python", "python", "t.py", "-np",
        "9"}},  // the program's own -np is its own
      {{"-H", "localhost:3", "./prog"},
       {"--contract", "horovod", "--nproc-per-node", "3", "--no-python", "./prog"}},
      {{"-H", "box:2,localhost", "-np", "3", "./prog"},
       {"--contract", "horovod", "--nproc-per-node", "3", "--no-python", "./prog"}},
      // Not horovodrun's spelling: untouched.
      {{"--nproc-per-node", "2", "train.py", "-np", "3"},
       {"--nproc-per-node", "2", "train.py", "-np", "3"}},
      {{}, {}},
  };
  for (const auto& c : cases) {
    auto got = RewriteHorovodrunSpelling(c.in, Here);
    REQUIRE(got.ok());
    CHECK(*got == c.out);
  }
}

TEST_CASE("horovodrun spelling: other hosts, too many processes and bad values are refused",
          "[horovodrun]") {
  const struct {
    Args in;
    const char* message;
  } cases[] = {
      {{"-np", "8", "-H", "node1:4,node2:4", "python", "t.py"},
       "-H 'node1:4,node2:4' names node1, which is not this host: crun does not start processes "
       "on other hosts (it does not ssh): run on each node `crun --contract horovod --nnodes 2 "
       "--nproc-per-node 4 --rdzv-endpoint node1:29400 train.py`"},
      {{"-np", "8", "-H", "localhost:4", "./p"},
       "-np 8 is more than the 4 slots of -H localhost:4"},
      {{"-np", "0", "./p"}, "-np '0' is not a whole number from 1 to 4096"},
      {{"-np", "two", "./p"}, "-np 'two' is not a whole number from 1 to 4096"},
      {{"-H", "localhost:0", "./p"}, "-H 'localhost:0': 'localhost:0' is not host:slots"},
      {{"-H", ":4", "./p"}, "-H ':4': a host is empty"},
      {{"-np"}, "-np needs a value"},
      {{"-np", "2"}, "-np/-H: no program to run after them"},
  };
  for (const auto& c : cases) {
    INFO(c.message);
    auto got = RewriteHorovodrunSpelling(c.in, Here);
    REQUIRE_FALSE(got.ok());
    CHECK(got.status().message().find(c.message) == 0);
  }
}
