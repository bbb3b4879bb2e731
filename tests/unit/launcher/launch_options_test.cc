// The launcher's option parsers (launcher/launch_values.h): tables of values and what each
// means or why it is refused.
#include <catch2/catch.hpp>

#include <csignal>
#include <string>
#include <vector>

#include "launcher/launch_options.h"
#include "launcher/launch_values.h"

namespace {

using namespace crun::launcher;
using Ints = std::vector<int>;
using Strings = std::vector<std::string>;

}  // namespace

TEST_CASE("nnodes takes N or MIN:MAX", "[options]") {
  CHECK(ParseNnodes("1")->max == 1);
  CHECK(ParseNnodes("2:4")->min == 2);
  CHECK(ParseNnodes("2:4")->max == 4);
  for (const char* bad : {"", "0", "4:2", "1:", ":2", "a", "1:2:3", "-1", "2 ", "100001"}) {
    INFO(bad);
    CHECK_FALSE(ParseNnodes(bad).ok());
  }
  CHECK(ParseNnodes("x").status().message().find("--nnodes 'x'") == 0);
}

TEST_CASE("whole numbers and seconds are read strictly with short messages", "[options]") {
  CHECK(*ParseFlagInt("--max-restarts", "3", 0, 1000) == 3);
  const auto negative = ParseFlagInt("--max-restarts", "-1", 0, 1000);
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.status().message() ==
        "--max-restarts '-1': expected a whole number from 0 to 1000");
  CHECK(negative.status().message().size() < 80);
  for (const char* bad : {"", "1.5", "1x", "+1", " 1", "99999999999999999999"}) {
    INFO(bad);
    CHECK_FALSE(ParseFlagInt("--node-rank", bad, 0, 1000).ok());
  }
  CHECK(*ParseFlagSeconds("--shutdown-timeout", "2.5") == 2.5);
  CHECK(*ParseFlagSeconds("--shutdown-timeout", "0") == 0);
  for (const char* bad : {"nan", "inf", "-1", "1e99", "", "3s"}) {
    INFO(bad);
    CHECK_FALSE(ParseFlagSeconds("--shutdown-timeout", bad).ok());
  }
}

TEST_CASE("redirects and tee parse the whole value", "[options]") {
  CHECK(ParseStdSpec("--tee", "3")->For(2) == Ints{3, 3});
  CHECK(ParseStdSpec("--tee", "0:1,1:2")->For(3) == Ints{1, 2, 0});
  CHECK(ParseStdSpec("--tee", "5:3")->For(2) == Ints{0, 0});  // ranks not on this node
  CHECK(ParseStdSpec("--tee", "0")->For(0).empty());
  for (const char* bad : {"1x:3", "0:3x", "4", "0:4", "a", "", "0:", ":1", "-1:1", "1,2"}) {
    INFO(bad);
    CHECK_FALSE(ParseStdSpec("--tee", bad).ok());
  }
  CHECK(ParseStdSpec("--tee", "1x:3").status().message().find("--tee '1x:3'") == 0);
}

TEST_CASE("local-ranks-filter names local ranks of this node", "[options]") {
  CHECK(*ParseRankList("0,1") == Ints{0, 1});
  CHECK(ParseRankList("")->empty());
  CHECK_FALSE(ParseRankList("0x").ok());
  CHECK_FALSE(ParseRankList("-1").ok());
  // Whether a rank is on this node is the plan's to say, knowing nproc.
  CHECK(CheckLocalRanks({0, 1}, 2).ok());
  CHECK(CheckLocalRanks({2}, 2).message() ==
        "--local-ranks-filter: '2' is not a local rank in 0..1");
}

TEST_CASE("signals-to-handle takes names and numbers crun can catch", "[options]") {
  CHECK(*ParseSignals("SIGTERM,INT,15") == Ints{SIGTERM, SIGINT, SIGTERM});
  CHECK_FALSE(ParseSignals("SIGKILL").ok());
  CHECK_FALSE(ParseSignals("SIGNOPE").ok());
  // Digits past any signal number, and past int: refused, not thrown (std::stoi did).
  CHECK_FALSE(ParseSignals("65").ok());
  CHECK_FALSE(ParseSignals("99999999999999999999").ok());
}

TEST_CASE("duplicate filters split on commas where a doubled comma is a comma", "[options]") {
  CHECK(ParseFilters("loss,acc") == Strings{"loss", "acc"});
  CHECK(ParseFilters("a,,b,c") == Strings{"a,b", "c"});
  CHECK(ParseFilters("").empty());
  CHECK(ParseFilters(",x,") == Strings{"x"});
}

TEST_CASE("rdzv-conf takes torchrun's keys and crun's and ignores unknown ones", "[options]") {
  auto c = ParseRdzvConf(
      "join_timeout=5,keep_alive_interval=2,keep_alive_max_attempt=4,"
      "store_type=tcp,is_host=T,node_id=n1,read_timeout=7,rank=3,"
      "cas_backoff=9,last_call_timeout=0.5");
  REQUIRE(c.ok());
  CHECK(*c->join_timeout == 5);
  CHECK(*c->heartbeat_interval == 2);
  CHECK(*c->keep_alive_max_attempt == 4);
  CHECK(*c->is_host);
  CHECK(c->node_id == "n1");
  CHECK(*c->read_timeout == 7);
  CHECK(*c->last_call_timeout == 0.5);
  CHECK(c->ignored == Strings{"cas_backoff"});
  CHECK_FALSE(*ParseRdzvConf("is_host=no")->is_host);
  struct Row {
    const char* text;
    const char* message_starts;
  };
  for (const Row& row : std::vector<Row>{
           {"store_type=file", "--rdzv-conf: store_type='file'"},
           {"join_timeout=nan", "--rdzv-conf: join_timeout='nan'"},
           {"join_timeout=0", "--rdzv-conf: join_timeout='0'"},
           {"keep_alive_max_attempt=0", "--rdzv-conf: keep_alive_max_attempt='0'"},
           {"is_host=maybe", "--rdzv-conf: is_host='maybe'"},
           {"node_id=", "--rdzv-conf: node_id has no value"},
           {",,,", "--rdzv-conf ',,,': an empty item"},
           {"a=1,,b=2", "--rdzv-conf 'a=1,,b=2': an empty item"},
           {"join_timeout=1,", "--rdzv-conf 'join_timeout=1,': an empty item"},
           {"=3", "--rdzv-conf: '=3' has no key"},
           {"justakey", "--rdzv-conf: 'justakey' is not key=value"},
       }) {
    INFO(row.text);
    const auto r = ParseRdzvConf(row.text);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().rfind(row.message_starts, 0) == 0);
  }
}

TEST_CASE("a run id is a name for files", "[options]") {
  for (const char* good : {"job7", "slurm-4242.3", "exp:lr=0.1", "a@b+c_d"}) {
    INFO(good);
    CHECK(CheckRunId(good).ok());
  }
  const std::vector<std::string> bad_ids{"",          "../../escape",       "a/b", ".hidden", "-x",
                                         "has space", std::string(129, 'x')};
  for (const std::string& bad : bad_ids) {
    INFO(bad);
    CHECK_FALSE(CheckRunId(bad).ok());
  }
  CHECK(CheckRunId(std::string(100000, 'x')).message().size() < 200);
}

TEST_CASE("keep-alive keys set the heartbeat timeout as torchrun means them", "[options]") {
  using std::chrono::milliseconds;
  const milliseconds fallback(3000);
  CHECK(HeartbeatTimeout(*ParseRdzvConf(""), fallback) == fallback);
  // torchrun's defaults: a heartbeat every 5 s, dead after 3 missed.
  CHECK(HeartbeatTimeout(*ParseRdzvConf("keep_alive_interval=5"), fallback) == milliseconds(15000));
  CHECK(HeartbeatTimeout(*ParseRdzvConf("keep_alive_interval=0.5,keep_alive_max_attempt=4"),
                         fallback) == milliseconds(2000));
  CHECK(HeartbeatTimeout(*ParseRdzvConf("keep_alive_max_attempt=5"), fallback) ==
        milliseconds(5000));
  CHECK(HeartbeatTimeout(*ParseRdzvConf("keep_alive_interval=5,heartbeat_timeout=7"), fallback) ==
        milliseconds(7000));
}

TEST_CASE("an unknown option is named with the closest known one", "[options]") {
  const Strings known{"--nproc-per-node", "--nproc_per_node", "--nnodes", "--max-restarts"};
  CHECK(UnknownOptionMessage("--nproc-per-nodes", known) ==
        "unknown option '--nproc-per-nodes' (did you mean --nproc-per-node?); crun --help "
        "lists the options");
  CHECK(UnknownOptionMessage("--max_restart=3", known).find("(did you mean --max-restarts?)") !=
        std::string::npos);
  CHECK(UnknownOptionMessage("--frobnicate", known).find("did you mean") == std::string::npos);
}

TEST_CASE("the launcher declares every torchrun 2.x option in both spellings", "[options]") {
  CLI::App app;
  LaunchOptions o;
  AddLaunchOptions(app, o);
  const auto known = KnownLongOptions(app);
  for (const char* name : {"nnodes",
                           "nproc-per-node",
                           "rdzv-backend",
                           "rdzv-endpoint",
                           "rdzv-id",
                           "rdzv-conf",
                           "standalone",
                           "max-restarts",
                           "monitor-interval",
                           "start-method",
                           "event-log-handler",
                           "role",
                           "module",
                           "no-python",
                           "run-path",
                           "log-dir",
                           "redirects",
                           "tee",
                           "local-ranks-filter",
                           "duplicate-stdout-filters",
                           "duplicate-stderr-filters",
                           "node-rank",
                           "master-addr",
                           "master-port",
                           "local-addr",
                           "logs-specs",
                           "numa-binding",
                           "signals-to-handle",
                           "shutdown-timeout",
                           "virtual-local-rank",
                           "log-line-prefix-template"}) {
    std::string dashed = std::string("--") + name, underscored = dashed;
    for (std::size_t i = 2; i < underscored.size(); ++i) {
      if (underscored[i] == '-') underscored[i] = '_';
    }
    INFO(dashed);
    CHECK(std::find(known.begin(), known.end(), dashed) != known.end());
    CHECK(std::find(known.begin(), known.end(), underscored) != known.end());
  }
}

TEST_CASE("completion scripts list the options for bash and zsh and tcsh", "[options]") {
  const Strings known{"--nnodes", "--tee"};
  CHECK(CompletionScript("bash", known)
            ->find("complete -o default -o bashdefault -W \"--nnodes --tee\" crun") !=
        std::string::npos);
  CHECK(CompletionScript("zsh", known)->find("compadd -- --nnodes --tee") != std::string::npos);
  CHECK(CompletionScript("tcsh", known)->find("'c/--/(nnodes tee)/'") != std::string::npos);
  CHECK_FALSE(CompletionScript("fish", known).ok());
}
