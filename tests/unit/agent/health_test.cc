// The health gate (agent/health/health_checks.h): what a spec means, what nvidia-smi's answers
// and free space say (tables), and the gate and its helper runs with real processes: a check
// that fails, one that hangs (killed at its deadline with what it started), one whose
// descendant holds its output open after it exited, and a gate cancelled under way. Every wait
// has a deadline; nothing outlives its case.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>

#include "agent/health/health_checks.h"
#include "agent/supervise/children.h"
#include "agent/supervise/tool_run.h"
#include "base/numbers.h"
#include "base/proc.h"
#include "tests/unit/temp_dir.h"

namespace {

using namespace std::chrono_literals;
using namespace crun::agent;
namespace asio = boost::asio;

ChildRegistry& Children() {
  static ChildRegistry children;
  return children;
}

// Runs `io` until `done` or 20 s.
template <typename Done>
void RunUntil(asio::io_context& io, const Done& done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    io.restart();  // a loop that ran out of work stops until restarted
    io.run_for(10ms);
  }
  REQUIRE(done());
}

ToolResult Tool(std::vector<std::string> argv, std::chrono::milliseconds deadline) {
  asio::io_context io;
  std::optional<ToolResult> got;
  RunTool(io, Children(), {std::move(argv), {}}, deadline, [&](ToolResult r) { got = r; });
  RunUntil(io, [&] { return got.has_value(); });
  return *got;
}

bool Alive(pid_t pid) { return ::kill(pid, 0) == 0 && crun::ProcessState(pid) != 'Z'; }

}  // namespace

constexpr const char* kPath = "/usr/bin:/bin";

TEST_CASE("health check specs: built-ins, sizes and commands", "[health]") {
  struct Row {
    const char* spec;
    HealthCheck::Kind kind;
    std::uint64_t min_free;
  };
  const Row rows[] = {
      {"gpu", HealthCheck::Kind::kGpu, 0},
      {"disk", HealthCheck::Kind::kDisk, kDefaultMinFreeDisk},
      {"disk:10G", HealthCheck::Kind::kDisk, std::uint64_t{10} << 30},
      {"memory", HealthCheck::Kind::kMemory, kDefaultMinFreeMemory},
      {"memory:512MiB", HealthCheck::Kind::kMemory, std::uint64_t{512} << 20},
      {"test -e /mnt/data/ready", HealthCheck::Kind::kCommand, 0},
      {"./disk", HealthCheck::Kind::kCommand, 0},  // a script of that name: a command
      {"/opt/checks/ib-ok", HealthCheck::Kind::kCommand, 0},
      {"exit 0", HealthCheck::Kind::kCommand, 0},  // builtins and syntax are on no PATH
      {"[ -d /tmp ]", HealthCheck::Kind::kCommand, 0},
      {"FLAG=1 sh -c 'exit 0'", HealthCheck::Kind::kCommand, 0},
  };
  for (const Row& r : rows) {
    INFO(r.spec);
    auto c = ParseHealthCheck(r.spec, "/usr/bin/nvidia-smi", kPath);
    REQUIRE(c.ok());
    CHECK(c->kind == r.kind);
    CHECK(c->min_free == r.min_free);
    CHECK(c->spec == r.spec);
  }
  struct Bad {
    const char* spec;
    const char* nvidia_smi;
    const char* words;
  };
  const Bad bad[] = {
      {"", "/x", "--health-check '': is empty"},
      {"  ", "/x", "is empty"},
      {"gpu", "", "--health-check 'gpu': needs nvidia-smi, which is not on PATH"},
      {"disk:0", "/x", "'0' is not a size above 0"},
      {"disk:", "/x", "'' is not a size above 0"},
      {"memory:8GB", "/x", "'8GB' is not a size above 0 such as 512M or 8G"},
      {"memory:-1G", "/x", "'-1G' is not a size"},
      // Typos of a built-in run no shell command that could pass: refused before any join.
      {"gpus", "/x", "--health-check 'gpus': no command 'gpus' on PATH (did you mean gpu?)"},
      {"dsk:10G", "/x", "no command 'dsk:10G' on PATH (did you mean disk?)"},
      {"memroy", "/x", "(did you mean memory?)"},
      {"no-such-probe --quick", "/x",
       "no command 'no-such-probe' on PATH; give gpu, disk[:SIZE], memory[:SIZE] or a command"},
  };
  for (const Bad& b : bad) {
    INFO(b.spec);
    auto c = ParseHealthCheck(b.spec, b.nvidia_smi, kPath);
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(c.status().message(), Catch::Contains(b.words));
  }
}

TEST_CASE("nvidia-smi's answers: what refuses a GPU, for the GPUs the node uses", "[health][gpu]") {
  struct Row {
    const char* what;
    const char* csv;
    std::vector<std::string> visible;
    std::vector<std::string> expected;
  };
  const Row rows[] = {
      {"healthy", "0, GPU-a, 0, No\n1, GPU-b, 0, No\n", {}, {}},
      {"N/A is no finding", "0, GPU-a, [N/A], [N/A]\n", {}, {}},
      {"not supported is no finding", "0, GPU-a, [Not Supported], No\n", {}, {}},
      {"ECC errors",
       "0, GPU-a, 0, No\n1, GPU-b, 3, No\n",
       {},
       {"gpu: GPU 1 (GPU-b) has 3 uncorrectable ECC errors since the driver loaded"}},
      {"ECC errors on a GPU not used", "0, GPU-a, 0, No\n1, GPU-b, 3, No\n", {"0"}, {}},
      {"used by uuid prefix",
       "0, GPU-a1, 0, No\n1, GPU-b7, 3, No\n",
       {"GPU-b"},
       {"gpu: GPU 1 (GPU-b7) has 3 uncorrectable ECC errors since the driver loaded"}},
      {"retired pages pending",
       "0, GPU-a, 0, Yes\n",
       {},
       {"gpu: GPU 0 (GPU-a) has retired pages pending: it needs a reset"}},
      {"both on one GPU",
       "0, GPU-a, 1, Yes\n",
       {},
       {"gpu: GPU 0 (GPU-a) has 1 uncorrectable ECC errors since the driver loaded",
        "gpu: GPU 0 (GPU-a) has retired pages pending: it needs a reset"}},
      {"unknown error",
       "0, GPU-a, [Unknown Error], [Unknown Error]\n",
       {},
       {"gpu: GPU 0 (GPU-a) does not answer ([Unknown Error], [Unknown Error])"}},
      {"GPU lost",
       "0, [GPU is lost], ERR!, ERR!\n",
       {},
       {"gpu: GPU 0 ([GPU is lost]) does not answer (ERR!, ERR!)"}},
      {"garbage count",
       "0, GPU-a, many, No\n",
       {},
       {"gpu: GPU 0 (GPU-a) reports 'many' uncorrectable ECC errors"}},
      {"a short line",
       "0, GPU-a\n",
       {},
       {"gpu: nvidia-smi's answer has a line of 2 fields, not 4",
        "gpu: nvidia-smi lists none of the GPUs this node "
        "should use"}},
      {"no GPU at all", "", {}, {"gpu: nvidia-smi lists none of the GPUs this node should use"}},
      {"none of those asked",
       "0, GPU-a, 0, No\n",
       {"3"},
       {"gpu: nvidia-smi lists none of the GPUs this node should use"}},
  };
  for (const Row& r : rows) {
    INFO(r.what);
    CHECK(JudgeGpus(r.csv, r.visible) == r.expected);
  }
  CHECK(JudgeRemappedRows("0, GPU-a, No, No\n1, GPU-b, Yes, No\n2, GPU-c, No, Yes\n", {}) ==
        std::vector<std::string>{"gpu: GPU 1 (GPU-b) has rows pending remapping: it needs a reset",
                                 "gpu: GPU 2 (GPU-c) failed to remap a row: it needs service"});
  CHECK(JudgeRemappedRows("1, GPU-b, Yes, No\n", {"0"}).empty());
  CHECK(VisibleUuids("0, GPU-a, 0, No\n1, GPU-b, 0, No\n", {"1"}) ==
        std::vector<std::string>{"GPU-b"});
  CHECK(JudgeComputeApps("4242, GPU-a, 1024\n77, GPU-b, [N/A]\n", {"GPU-a", "GPU-b"}) ==
        std::vector<std::string>{"process 4242 holds 1024 MiB on GPU-a",
                                 "process 77 holds memory on GPU-b"});
  CHECK(JudgeComputeApps("4242, GPU-c, 1024\n", {"GPU-a"}).empty());
  CHECK(JudgeComputeApps("", {"GPU-a"}).empty());
}

TEST_CASE("free space and memory, with the sizes in words", "[health]") {
  CHECK(JudgeFree("disk", "/logs", 2u << 30, 1u << 30, "disk").empty());
  CHECK(JudgeFree("disk", "/logs", 120u << 20, 1u << 30, "disk") ==
        "disk: /logs has 120.0 MiB free, below the 1.00 GiB asked (--health-check disk)");
  CHECK(AvailableMemory("MemTotal:  100 kB\nMemFree: 10 kB\nMemAvailable:   2048 kB\n") ==
        2u << 20);
  CHECK_FALSE(AvailableMemory("MemTotal: 100 kB\n").has_value());
}

TEST_CASE("a command check's verdict names it, its exit and its last lines", "[health]") {
  ToolResult run;
  run.started = true;
  run.exit = {false, 0};
  CHECK(JudgeCommand("true", run).empty());
  run.exit = {false, 4};
  run.output = "a\nb\n\nc\nd\ne\nf\n";
  CHECK(JudgeCommand("check", run) ==
        "health check `check` failed with exit code 4: b | c | d | e | f");
  run.exit = {true, 9};
  run.output = "";
  CHECK(JudgeCommand("check", run) ==
        "health check `check` failed with signal 9 (SIGKILL) (no output)");
  run.timed_out = true;
  CHECK(JudgeCommand("check", run) ==
        "health check `check` did not finish in time; killed "
        "(no output)");
  ToolResult never;
  never.error = "no such program";
  CHECK(JudgeCommand("check", never) == "health check `check` could not start: no such program");
}

TEST_CASE("a helper run: its output and exit, a kill at the deadline with what it started",
          "[health][tool]") {
  auto ok = Tool({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, 10s);
  CHECK(ok.started);
  CHECK_FALSE(ok.timed_out);
  CHECK(ok.exit.value == 3);
  CHECK(ok.output == "out\nerr\n");

  crun::testing::TempDir dir;
  const std::string pid_file = dir.path + "/child";
  auto hung = Tool({"/bin/sh", "-c", "sleep 600 & echo $! > " + pid_file + "; sleep 600"}, 300ms);
  CHECK(hung.timed_out);
  CHECK_FALSE(hung.ok());
  std::ifstream in(pid_file);
  pid_t child = 0;
  in >> child;
  REQUIRE(child > 0);
  // Its group went with it (SIGKILL to the group; the kernel ends the child a moment later).
  asio::io_context wait;
  RunUntil(wait, [&] { return !Alive(child); });

  // Exited, but a descendant that left its group holds the output open: the run ends at the
  // deadline with what was read, as the exit it had.
  const auto began = std::chrono::steady_clock::now();
  auto held = Tool({"/bin/sh", "-c",
                    "echo before; setsid sh -c 'echo $$ > " + pid_file +
                        "2; exec sleep 600' & "
                        "exit 0"},
                   500ms);
  CHECK(std::chrono::steady_clock::now() - began < 15s);
  CHECK(held.ok());
  CHECK(held.output.rfind("before\n", 0) == 0);
  std::ifstream in2(pid_file + "2");
  pid_t daemon = 0;
  in2 >> daemon;
  if (daemon > 0) ::kill(daemon, SIGKILL);

  auto missing = Tool({"/nonexistent/program"}, 1s);
  CHECK_FALSE(missing.started);
  CHECK_THAT(missing.error, Catch::Contains("/nonexistent/program"));
}

TEST_CASE("the gate: every check at once, every failure named", "[health]") {
  crun::testing::TempDir dir;
  HealthGateOptions o;
  o.timeout = 10s;
  o.dirs = {dir.path};
  for (const char* spec : {"true", "echo sick >&2; exit 5", "disk:1K", "memory:1K", "exit 6"}) {
    auto c = ParseHealthCheck(spec, "", kPath);
    REQUIRE(c.ok());
    o.checks.push_back(*c);
  }
  asio::io_context io;
  std::optional<HealthVerdict> verdict;
  auto gate = RunHealthGate(io, Children(), o, [&](HealthVerdict v) { verdict = v; });
  CHECK_FALSE(verdict.has_value());  // never from inside the call
  RunUntil(io, [&] { return verdict.has_value(); });
  CHECK_FALSE(verdict->ok());
  CHECK(verdict->failures.size() == 2);
  CHECK_THAT(verdict->Describe(),
             Catch::Contains(
                 "health check `echo sick >&2; exit 5` failed with exit code 5: sick") &&
                 Catch::Contains("health check `exit 6` failed with exit code 6"));

  // Too little disk, a directory that is not there.
  o.checks = {*ParseHealthCheck("disk:1000000T", "", kPath)};
  o.dirs = {dir.path, dir.path + "/absent"};
  verdict.reset();
  gate = RunHealthGate(io, Children(), o, [&](HealthVerdict v) { verdict = v; });
  RunUntil(io, [&] { return verdict.has_value(); });
  CHECK_THAT(verdict->Describe(),
             Catch::Contains("below the 1000000.00 TiB asked (--health-check disk:1000000T)") &&
                 Catch::Contains("disk: cannot create a file in " + dir.path + "/absent"));
}

TEST_CASE("a gate cancelled under way kills its checks and never answers", "[health]") {
  crun::testing::TempDir dir;
  const std::string pid_file = dir.path + "/pid";
  HealthGateOptions o;
  o.timeout = 60s;
  o.checks = {*ParseHealthCheck("echo $$ > " + pid_file + "; exec sleep 600", "", kPath)};
  asio::io_context io;
  bool answered = false;
  auto gate = RunHealthGate(io, Children(), o, [&](HealthVerdict) { answered = true; });
  pid_t pid = 0;
  RunUntil(io, [&] {
    std::ifstream in(pid_file);
    return static_cast<bool>(in >> pid) && pid > 0;
  });
  gate->Cancel();
  RunUntil(io, [&] { return !Alive(pid); });
  io.run_for(100ms);
  CHECK_FALSE(answered);
}
