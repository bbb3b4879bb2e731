// LocalAgent driven through the Rendezvous interface by a scripted rendezvous, with real
// /bin/sh workers: what it starts (ranks, environment, log directories), what it reports
// (success, the first failure with its stderr, failure.json), restarts, launch failures, and
// how it stops a group (SIGTERM, then SIGKILL after the grace). Every run is bounded by the
// workers' own commands; no worker outlives its test.
#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "agent/failures/report_format.h"
#include "agent/local_agent.h"
#include "agent/observe/agent_metrics.h"
#include "tests/unit/temp_dir.h"

namespace {

namespace asio = boost::asio;
using namespace crun::agent;

// Answers every Join with an assignment of round joins-1 at once; a failure with a restart
// while any remain, else with the job's failure; a success with the job's success.
class ScriptedRendezvous final : public Rendezvous {
 public:
  struct Record {
    int joins = 0;
    int successes = 0;
    std::vector<crun::report::FailureReport> failures;
    std::vector<std::string> left;
    std::vector<std::string> unhealthy;
  };

  ScriptedRendezvous(asio::io_context& io, int nproc, int max_restarts, Record* record)
      : io_(io), nproc_(nproc), max_restarts_(max_restarts), record_(record) {}

  void Start(RendezvousEvents* events) override { events_ = events; }
  void Join(const std::vector<std::uint16_t>& /*ports*/) override {
    GroupAssignment g;
    g.run_id = "unit";
    g.local_world_size = nproc_;
    g.world_size = nproc_;
    g.role_world_size = nproc_;
    g.master_addr = "127.0.0.1";
    g.master_port = 29999;  // nobody listens: the workers here never connect
    g.restart_count = restarts_;
    g.max_restarts = max_restarts_;
    g.round = record_->joins++;
    asio::post(io_, [this, g] { events_->OnAssignment(g); });
  }
  void ReportUnhealthy(const std::string& why) override { record_->unhealthy.push_back(why); }
  void ReportFailure(const crun::report::FailureReport& failures) override {
    record_->failures.push_back(failures);
    if (restarts_ < max_restarts_) {
      ++restarts_;
      asio::post(io_, [this] { events_->OnStopAndRejoin({"a worker failed", true, "peer", {}}); });
      return;
    }
    JobOutcome o;
    o.exit_code = ExitOf(failures.failures.front()).ShellCode();
    o.reason = "a worker failed";
    o.root_node_id = node_id();
    o.root_report = failures;
    asio::post(io_, [this, o] { events_->OnFinished(o); });
  }
  void ReportSuccess() override {
    ++record_->successes;
    JobOutcome o;
    o.success = true;
    asio::post(io_, [this, o] { events_->OnFinished(o); });
  }
  void Leave(const std::string& reason) override { record_->left.push_back(reason); }
  std::string node_id() const override { return "unit-node"; }
  void AskStacks(const std::string&, std::chrono::milliseconds,
                 std::function<void(RemoteStacks)> done) override {
    asio::post(io_, [done = std::move(done)] { done({}); });
  }
  void ReplyStacks(std::uint64_t, const std::string&, const std::vector<RankStacks>&,
                   const std::string&) override {}

 private:
  asio::io_context& io_;
  int nproc_;
  int max_restarts_;
  int restarts_ = 0;
  Record* record_;
  RendezvousEvents* events_ = nullptr;
};

using crun::testing::TempDir;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `script` (sh -c) as `nproc` workers under a LocalAgent; the record of what the
// rendezvous heard and the agent's exit code.
struct Outcome {
  int code = -1;
  ScriptedRendezvous::Record record;
};
Outcome RunAgent(const TempDir& dir, int nproc, const std::string& script, int max_restarts = 0,
                 std::chrono::milliseconds grace = std::chrono::seconds(5),
                 const std::vector<FeatureFactory>& features = DefaultFeatures()) {
  AgentOptions o;
  o.command = {"/bin/sh", "-c", script, "worker", "${local_rank}"};
  o.nproc = nproc;
  o.max_restarts = max_restarts;
  o.shutdown_timeout = grace;
  o.host_name = "unit-host";
  o.entrypoint = "/bin/sh";
  o.log_dir = dir.path;
  o.redirects = std::vector<int>(static_cast<std::size_t>(nproc), 3);  // keep the console quiet
  Outcome out;
  asio::io_context io(1);
  LocalAgent agent(io, o,
                   std::make_unique<ScriptedRendezvous>(io, nproc, max_restarts, &out.record),
                   features);
  out.code = agent.Run();
  return out;
}

}  // namespace

TEST_CASE("agent: workers get their ranks and logs, and success is reported once", "[agent]") {
  TempDir dir;
  const auto out = RunAgent(dir, 3,
                            "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $MASTER_PORT $1\" > "
                            "\"$TORCHELASTIC_ERROR_FILE.ranks\"");
  CHECK(out.code == 0);
  CHECK(out.record.joins == 1);
  CHECK(out.record.successes == 1);
  CHECK(out.record.failures.empty());
  for (int lr = 0; lr < 3; ++lr) {
    const std::string l = std::to_string(lr);
    CHECK(Read(dir.path + "/attempt_0/" + l + "/error.json.ranks") ==
          l + " " + l + " 3 29999 " + l + "\n");
  }
  CHECK_FALSE(std::filesystem::exists(dir.path + "/failure.json"));
}

TEST_CASE("agent: the first failure is reported with its stderr and written out", "[agent]") {
  TempDir dir;
  const auto out = RunAgent(dir, 2,
                            "if [ \"$1\" = 1 ]; then echo 'boom on rank 1' >&2; exit 3; fi; "
                            "exec sleep 60");
  CHECK(out.code == 3);
  REQUIRE(out.record.failures.size() == 1);
  CHECK(out.record.failures[0].host == "unit-host");
  const crun::report::WorkerFailure& root = out.record.failures[0].failures.front();
  CHECK(root.rank == 1);
  CHECK(root.local_rank == 1);
  CHECK(ExitOf(root).ShellCode() == 3);
  REQUIRE_FALSE(root.stderr_tail.empty());
  CHECK(root.stderr_tail.back() == "boom on rank 1");
  const std::string report = Read(dir.path + "/failure.json");
  CHECK_THAT(report, Catch::Contains("boom on rank 1"));
  CHECK(out.record.successes == 0);
  REQUIRE(out.record.left.size() == 1);
  CHECK(out.record.left[0] == "exit code 3");
}

TEST_CASE("agent: a failed round is restarted and its next attempt succeeds", "[agent]") {
  TempDir dir;
  const std::string marker = dir.path + "/failed-once";
  const auto out = RunAgent(dir, 2,
                            "if [ \"$1\" = 0 ] && [ ! -e " + marker + " ]; then touch " + marker +
                                "; exit 7; fi; echo \"$TORCHELASTIC_RESTART_COUNT\" > "
                                "\"$TORCHELASTIC_ERROR_FILE.restarts\"",
                            1);
  CHECK(out.code == 0);
  CHECK(out.record.joins == 2);
  CHECK(out.record.failures.size() == 1);
  CHECK(out.record.successes == 1);
  CHECK(Read(dir.path + "/attempt_1/0/error.json.restarts") == "1\n");
  CHECK(Read(dir.path + "/attempt_1/1/error.json.restarts") == "1\n");
}

TEST_CASE("agent: a program that cannot be started fails with the shell's code", "[agent]") {
  TempDir dir;
  AgentOptions o;
  o.command = {dir.path + "/no-such-program"};
  o.host_name = "unit-host";
  o.log_dir = dir.path;
  ScriptedRendezvous::Record record;
  asio::io_context io(1);
  LocalAgent agent(io, o, std::make_unique<ScriptedRendezvous>(io, 1, 0, &record));
  CHECK(agent.Run() == 127);
  REQUIRE(record.failures.size() == 1);
  CHECK(ExitOf(record.failures[0].failures.front()).ShellCode() == 127);
}

TEST_CASE("agent: a worker that ignores SIGTERM is killed after the grace", "[agent]") {
  TempDir dir;
  // Rank 1 ignores SIGTERM (sleep inherits the ignored disposition) and would otherwise end
  // well after 60 s; rank 0 fails once rank 1 says (through a FIFO) that it ignores SIGTERM.
  // failure.json shows rank 1 ended by SIGKILL.
  const std::string fifo = dir.path + "/ready";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto out = RunAgent(dir, 2,
                            "if [ \"$1\" = 0 ]; then timeout 30 cat " + fifo +
                                "; exit 5; fi; "
                                "trap '' TERM; echo ignoring > " +
                                fifo + "; sleep 60",
                            0, std::chrono::milliseconds(300));
  CHECK(out.code == 5);
  REQUIRE(out.record.failures.size() == 1);
  CHECK(out.record.failures[0].failures.front().rank == 0);
  const auto report = nlohmann::json::parse(Read(dir.path + "/failure.json"));
  REQUIRE(report["failures"].size() == 2);
  CHECK(report["failures"][0]["rank"] == 0);
  CHECK(report["failures"][0]["exit_code"] == 5);
  CHECK(report["failures"][1]["rank"] == 1);
  CHECK(report["failures"][1]["signal"] == "SIGKILL");
}

TEST_CASE("agent: each worker exit has one metrics cause", "[agent][metrics]") {
  const ExitStatus ok{false, 0}, code{false, 3}, killed{true, SIGKILL}, term{true, SIGTERM};
  CHECK(std::string(ExitCauseOf(ok, false, false, false)) == "success");
  CHECK(std::string(ExitCauseOf(ok, false, false, true)) == "success");  // done in time
  CHECK(std::string(ExitCauseOf(code, false, false, false)) == "exit_code");
  CHECK(std::string(ExitCauseOf(killed, false, false, false)) == "signal");
  CHECK(std::string(ExitCauseOf(killed, false, true, false)) == "oom");
  CHECK(std::string(ExitCauseOf(killed, false, true, true)) == "oom");  // OOM beats the stop
  CHECK(std::string(ExitCauseOf(term, false, false, true)) == "stopped");
  CHECK(std::string(ExitCauseOf(code, false, false, true)) == "stopped");  // its SIGTERM handler
  CHECK(std::string(ExitCauseOf(killed, true, false, true)) == "hang");    // crun killed it hung
  CHECK(std::string(ExitCauseOf(ok, true, false, true)) == "hang");
}

namespace {

// A test-only feature: writes each hook it hears to `log`, as one word and its arguments.
class HookRecorder final : public JobFeature {
 public:
  HookRecorder(AgentView& agent, std::vector<std::string>* log, bool fail_prepare)
      : agent_(agent), log_(log), fail_prepare_(fail_prepare) {}

  crun::Status Prepare() override {
    log_->push_back("prepare");
    if (fail_prepare_) return crun::Unavailable("the recorder's port 1 is taken");
    return crun::Status::Ok();
  }
  void ConfigureStreams(StreamOptions&) override { log_->push_back("streams"); }
  void OnRound(std::chrono::steady_clock::duration waited) override {
    log_->push_back("round " + std::to_string(agent_.group.round) +
                    (waited.count() >= 0 ? "" : " (negative wait)"));
  }
  void BeforeStart(AttemptStartContext& c) override {
    log_->push_back("before_start restart=" + std::to_string(c.group.restart_count));
  }
  void OnLaunched(const std::vector<WorkerStart>& starts) override {
    int started = 0;
    for (const auto& s : starts) started += s.launch.started ? 1 : 0;
    log_->push_back("launched " + std::to_string(started));
  }
  void OnAttemptStarted() override {
    log_->push_back(std::string("attempt_started ") +
                    (agent_.lifecycle.phase == lifecycle::Phase::kRunning ? "running" : "?"));
  }
  void OnWorkerExited(const WorkerEnd& e) override {
    if (e.exit.success()) return log_->push_back("exited ok");
    log_->push_back("exited rank=" + std::to_string(e.worker.local_rank) +
                    " failure=" + std::to_string(e.failure != nullptr) + " stops=" +
                    std::to_string(e.stops_group) + " stopping=" + std::to_string(e.stopping));
  }
  void OnRestarting(const crun::agent::StopNotice& stop) override {
    log_->push_back("restarting " + stop.reason + (stop.spends_restart ? " (spends)" : ""));
  }
  void OnAttemptEnded() override { log_->push_back("attempt_ended"); }
  void OnJoining() override { log_->push_back("joining"); }
  void OnFailureReported(const crun::report::FailureReport& r) override {
    log_->push_back("failure reported: " + crun::report::DescribeCause(r));
  }
  void OnFinish(int code) override { log_->push_back("finish " + std::to_string(code)); }

 private:
  AgentView& agent_;
  std::vector<std::string>* log_;
  bool fail_prepare_;
};

}  // namespace

TEST_CASE("agent: a feature registered in one line hears rounds, attempts and exits in order",
          "[agent]") {
  TempDir dir;
  std::vector<std::string> log;
  auto features = DefaultFeatures();
  features.push_back([&](AgentView& a) { return std::make_unique<HookRecorder>(a, &log, false); });
  // Attempt 0: local rank 0 fails; local rank 1 ignores the stop signal, so it is killed at the
  // grace's end, after the rendezvous's restart has arrived. Attempt 1: both succeed.
  const auto out = RunAgent(dir, 2,
                            "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
                            "[ \"$1\" = 0 ] && exit 7; trap '' TERM; exec sleep 60; fi; exit 0",
                            /*max_restarts=*/1, std::chrono::milliseconds(300), features);
  CHECK(out.code == 0);
  const std::vector<std::string> expected{
      "streams",
      "prepare",
      "joining",
      "round 0",
      "before_start restart=0",
      "launched 2",
      "attempt_started running",
      "exited rank=0 failure=1 stops=1 stopping=0",
      "failure reported: rank 0 (local rank 0) on unit-host failed with exit code 7",
      "restarting a worker failed (spends)",
      "exited rank=1 failure=1 stops=0 stopping=1",
      "attempt_ended",
      "joining",
      "round 1",
      "before_start restart=1",
      "launched 2",
      "attempt_started running",
      "exited ok",
      "exited ok",
      "attempt_ended",
      "finish 0",
  };
  CHECK(log == expected);
}

namespace {

// Hears the job's progress (AgentView::progress) and each worker's end, into one log.
class ProgressRecorder final : public JobFeature {
 public:
  ProgressRecorder(AgentView& agent, std::string name, std::vector<std::string>* log) : log_(log) {
    agent.progress.Listen({[this, name](int lr) { Add(name, lr, "beat"); },
                           [this, name](int lr, const crun::StepRecord& r) {
                             Add(name, lr,
                                 "step " + std::to_string(r.step) +
                                     (r.compute_us ? " " + std::to_string(*r.compute_us) : ""));
                           },
                           nullptr});
  }
  void OnWorkerExited(const WorkerEnd& e) override { Add("end", e.worker.local_rank, ""); }

 private:
  void Add(const std::string& name, int lr, const std::string& what) {
    log_->push_back(name + " " + std::to_string(lr) + (what.empty() ? "" : " " + what));
  }
  std::vector<std::string>* log_;
};

}  // namespace

TEST_CASE("agent: every listener hears each worker's beats and steps before its end",
          "[agent][steps]") {
  TempDir dir;
  std::vector<std::string> log;
  auto features = DefaultFeatures();
  for (const char* name : {"a", "b"}) {
    features.push_back(
        [&log, name](AgentView& a) { return std::make_unique<ProgressRecorder>(a, name, &log); });
  }
  // One worker: the short form, then a beat and a full record, all written before it exits
  // (dash takes no descriptor above 9 after >&: the pipe is opened again by its name).
  const auto out = RunAgent(dir, 1, "printf 'S 5\\n.S 6 100\\n' > /proc/self/fd/$CRUN_HEARTBEAT_FD",
                            0, std::chrono::seconds(5), features);
  CHECK(out.code == 0);
  std::vector<std::string> beats, rest;
  for (const auto& line : log)
    (line.find(" beat") != std::string::npos ? beats : rest).push_back(line);
  // The pipe may be read in pieces: the beats come in one or more reads, to both, in order.
  CHECK(!beats.empty());
  const std::vector<std::string> expected{"a 0 step 5",     "b 0 step 5", "a 0 step 6 100",
                                          "b 0 step 6 100", "end 0",      "end 0"};
  CHECK(rest == expected);
}

TEST_CASE("agent: a feature that cannot start ends the job before any join or worker", "[agent]") {
  TempDir dir;
  std::vector<std::string> log;
  const std::string marker = dir.path + "/ran";
  const auto out =
      RunAgent(dir, 2, "touch " + marker, 0, std::chrono::seconds(5),
               {[&](AgentView& a) { return std::make_unique<HookRecorder>(a, &log, true); }});
  CHECK(out.code == 1);
  CHECK(log == std::vector<std::string>{"streams", "prepare"});
  CHECK(out.record.joins == 0);
  CHECK_FALSE(std::filesystem::exists(marker));
}

namespace {

// A test-only feature that gates the join (JobFeature::BeforeJoin): it holds every join, and
// on the loop's next turn either lets it go or leaves the job as unhealthy.
class JoinGateProbe final : public JobFeature {
 public:
  JoinGateProbe(AgentView& agent, bool refuse, int* joins_seen_held)
      : agent_(agent), refuse_(refuse), joins_seen_held_(joins_seen_held) {}
  void BeforeJoin(JoinGate& gate) override {
    asio::post(agent_.io, [this, pass = gate.Hold()] {
      ++*joins_seen_held_;
      if (refuse_) return agent_.leave_job(lifecycle::NodeLeaves::Why::kUnhealthy, "probe: no");
      pass();
    });
  }

 private:
  AgentView& agent_;
  bool refuse_;
  int* joins_seen_held_;
};

}  // namespace

TEST_CASE("agent: a feature gating the join holds every join until it passes", "[agent]") {
  TempDir dir;
  int held = 0;
  auto features = DefaultFeatures();
  features.push_back(
      [&](AgentView& a) { return std::make_unique<JoinGateProbe>(a, false, &held); });
  // Attempt 0 fails, so the node joins twice: each join was held first.
  const auto out = RunAgent(dir, 1, "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exit 3; exit 0",
                            /*max_restarts=*/1, std::chrono::seconds(5), features);
  CHECK(out.code == 0);
  CHECK(out.record.joins == 2);
  CHECK(held == 2);
}

TEST_CASE("agent: a feature that refuses the join ends the job as a node to requeue without",
          "[agent]") {
  TempDir dir;
  int held = 0;
  const std::string marker = dir.path + "/ran";
  auto features = DefaultFeatures();
  features.push_back([&](AgentView& a) { return std::make_unique<JoinGateProbe>(a, true, &held); });
  const auto out = RunAgent(dir, 2, "touch " + marker, 0, std::chrono::seconds(5), features);
  CHECK(out.code == crun::report::kExitRequeueWithoutNode);
  CHECK(held == 1);
  CHECK(out.record.joins == 0);
  CHECK(out.record.unhealthy == std::vector<std::string>{"probe: no"});
  CHECK_FALSE(std::filesystem::exists(marker));
}
