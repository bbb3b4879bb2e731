// The backend table (launcher/backends/backend.h): a test-only backend registered with one line
// is chosen by --rdzv-backend, gets its own --rdzv-conf key, plans the run id and runs a real
// worker through crun's launcher; crun's own entries are one fact each (names, aliases and keys
// not shared), and what they plan is read back through their typed plans.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "agent/rendezvous/static_rendezvous.h"
#include "launcher/backends/backend.h"
#include "launcher/backends/etcd.h"
#include "launcher/launch_command.h"
#include "launcher/launch_plan.h"
#include "launcher/rendezvous_command.h"
#include "tests/unit/launcher/command_line.h"
#include "tests/unit/temp_dir.h"

namespace {

using namespace crun::launcher;
using crun::agent::Rendezvous;

// What the test-only backend saw, from its plan to its Close.
struct Seen {
  std::string greeting;  // its own --rdzv-conf key
  int opened = 0, joins = 0, successes = 0, closed = 0;
};

// The static rendezvous, with every call the agent makes counted.
class CountingRendezvous final : public Rendezvous {
 public:
  CountingRendezvous(std::unique_ptr<Rendezvous> inner, Seen* seen)
      : inner_(std::move(inner)), seen_(seen) {}
  void Start(crun::agent::RendezvousEvents* events) override { inner_->Start(events); }
  void Join(const std::vector<std::uint16_t>& ports) override {
    ++seen_->joins;
    inner_->Join(ports);
  }
  void ReportFailure(const crun::report::FailureReport& f) override { inner_->ReportFailure(f); }
  void ReportSuccess() override {
    ++seen_->successes;
    inner_->ReportSuccess();
  }
  void ReportUnhealthy(const std::string& why) override { inner_->ReportUnhealthy(why); }
  void Leave(const std::string& reason) override { inner_->Leave(reason); }
  std::string node_id() const override { return inner_->node_id(); }
  void AskStacks(const std::string& reason, std::chrono::milliseconds timeout,
                 std::function<void(crun::agent::RemoteStacks)> done) override {
    inner_->AskStacks(reason, timeout, std::move(done));
  }
  void ReplyStacks(std::uint64_t id, const std::string& host,
                   const std::vector<crun::agent::RankStacks>& ranks,
                   const std::string& error) override {
    inner_->ReplyStacks(id, host, ranks, error);
  }

 private:
  std::unique_ptr<Rendezvous> inner_;
  Seen* seen_;
};

class CountingRun final : public BackendRun {
 public:
  explicit CountingRun(Seen* seen) : seen_(seen) {}
  crun::StatusOr<std::unique_ptr<Rendezvous>> Open(const LaunchPlan& p, boost::asio::io_context& io,
                                                   const crun::agent::AgentOptions& a) override {
    ++seen_->opened;
    crun::agent::StaticRendezvousOptions r;
    r.run_id = p.run_id;
    r.nproc = p.nproc;
    r.host = a.host_name;
    return std::unique_ptr<Rendezvous>(
        std::make_unique<CountingRendezvous>(crun::agent::MakeStaticRendezvous(io, r), seen_));
  }
  void Close() override { ++seen_->closed; }

 private:
  Seen* seen_;
};

Backend CountingBackend(Seen* seen) {
  Backend b;
  b.name = "counting";
  b.aliases = {"tally"};
  b.help = "a test's";
  b.conf_keys = {"greeting"};
  b.plan = [seen](LaunchPlan& p, const PlanInputs&) -> crun::StatusOr<std::unique_ptr<BackendRun>> {
    auto greeting = p.values.rdzv_conf.backend_keys.find("greeting");
    if (greeting == p.values.rdzv_conf.backend_keys.end()) {
      return crun::InvalidArgument("--rdzv-backend counting needs --rdzv-conf greeting=...");
    }
    seen->greeting = greeting->second;
    p.run_id = "counted-" + greeting->second;
    return std::unique_ptr<BackendRun>(std::make_unique<CountingRun>(seen));
  };
  return b;
}

int Launch(std::vector<std::string> args, const Backends& backends) {
  args.insert(args.begin(), "crun");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return RunLaunch(static_cast<int>(argv.size()), argv.data(), backends);
}

crun::StatusOr<LaunchPlan> Plan(const std::vector<std::string>& args, const Backends& backends) {
  std::vector<std::string> words = args;
  words.insert(words.end(), {"--no-python", "/bin/true"});
  const auto c = testing::ParseCommandLine(words);
  MachineFacts facts;
  facts.system_root = "/nonexistent-root";
  return PlanLaunch(c.o, c.given, facts, backends);
}

}  // namespace

TEST_CASE("backends: a test-only backend is one line, planned and run", "[backends]") {
  Seen seen;
  Backends backends = DefaultBackends();
  backends.push_back(CountingBackend(&seen));  // the one line that registers it

  crun::testing::TempDir logs;
  // The worker checks that the run id the backend planned is the one it was given.
  const int code =
      Launch({"--rdzv-backend", "tally", "--rdzv-conf", "greeting=hi", "--log-dir", logs.path,
              "--no-python", "/bin/sh", "-c", "test \"$TORCHELASTIC_RUN_ID\" = counted-hi"},
             backends);
  CHECK(code == 0);
  CHECK(seen.greeting == "hi");
  CHECK(seen.opened == 1);
  CHECK(seen.joins == 1);
  CHECK(seen.successes == 1);
  CHECK(seen.closed == 1);

  // A worker that fails: crun's exit code is the worker's, through the same backend.
  CHECK(Launch({"--rdzv-backend", "counting", "--rdzv-conf", "greeting=x", "--log-dir", logs.path,
                "--no-python", "/bin/sh", "-c", "exit 3"},
               backends) == 3);
  CHECK(seen.closed == 2);

  // Its plan's own refusal; its key given to another backend; its name in the list.
  const auto without = Plan({"--rdzv-backend", "counting"}, backends);
  REQUIRE_FALSE(without.ok());
  CHECK_THAT(without.status().message(), Catch::Contains("needs --rdzv-conf greeting"));
  const auto foreign = Plan({"--rdzv-conf", "greeting=hi"}, backends);
  REQUIRE_FALSE(foreign.ok());
  CHECK(foreign.status().message() ==
        "--rdzv-conf greeting is for --rdzv-backend counting, not static");
  const auto unknown = Plan({"--rdzv-backend", "zk"}, backends);
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(unknown.status().message(), Catch::EndsWith("or counting (or tally)"));
  // Without the entry, crun's own table does not know the key: torchrun's rule, a note.
  const auto plain = Plan({"--rdzv-conf", "greeting=hi"}, DefaultBackends());
  REQUIRE(plain.ok());
  CHECK_THAT(plain->notes.at(0), Catch::Contains("ignoring unknown key 'greeting'"));
}

TEST_CASE("backends: a test-only backend declares its own crun status flag", "[backends]") {
  Backends backends = DefaultBackends();
  std::map<std::string, std::string> asked;  // what its fetch was given
  Backend lease = CountingBackend(nullptr);
  lease.name = "lease";
  lease.aliases = {};
  lease.status_help = "leases in a test's namespace";
  lease.endpoint_help = "the test's endpoint";
  lease.status_flags = {{"--lease-namespace", "lease: the namespace", "default-ns"}};
  lease.status = [&asked](const StatusQuery& q, crun::v1::StatusResponse*, std::string* where,
                          bool*) {
    asked = q.flags;
    asked["endpoint"] = q.endpoint;
    *where = "the test";
    return 0;
  };
  backends.push_back(lease);  // the one line that registers it

  CLI::App app{"crun"};
  int code = -1;
  AddStatusCommand(app, &code, backends);
  const std::string help = app.get_subcommand("status")->help();
  CHECK_THAT(help, Catch::Contains("--lease-namespace TEXT=default-ns"));
  CHECK_THAT(help, Catch::Contains("lease: leases in a test's namespace"));
  CHECK_THAT(help, Catch::Contains("; with lease, the test's endpoint"));
  std::vector<std::string> args{"crun",
                                "status",
                                "--rdzv-backend",
                                "lease",
                                "--rdzv-endpoint",
                                "somewhere",
                                "--lease-namespace",
                                "ns1",
                                "--json"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  CHECK(code == 0);
  CHECK(asked["--lease-namespace"] == "ns1");
  CHECK(asked["--etcd-prefix"] == "/crun/rdzv");  // etcd's default, as before
  CHECK(asked["endpoint"] == "somewhere");
}

TEST_CASE("backends: crun's table names each backend and key once", "[backends]") {
  const Backends backends = DefaultBackends();
  std::set<std::string> names, keys;
  for (const Backend& b : backends) {
    INFO(b.name);
    CHECK(names.insert(b.name).second);
    for (const auto& a : b.aliases) CHECK(names.insert(a).second);
    for (const auto& k : b.conf_keys) CHECK(keys.insert(k).second);
    // An entry is either refused or usable: planned, described.
    CHECK(b.refusal.empty() == static_cast<bool>(b.plan));
    CHECK(b.refusal.empty() == !b.help.empty());
  }
  // `crun status` asks the entries that can be asked, and names them when the value is wrong.
  const auto status = ChooseBackend(backends, "static", "--rdzv-backend",
                                    [](const Backend& b) { return b.status != nullptr; });
  REQUIRE_FALSE(status.ok());
  CHECK(status.status().message() ==
        "--rdzv-backend 'static': expected crun (or c10d) or etcd-v3 (or etcd)");
  // The help of --rdzv-backend and --rdzv-conf comes from the entries.
  CLI::App app;
  LaunchOptions o;
  AddLaunchOptions(app, o);
  DescribeBackends(app, backends);
  const std::string help = app.get_option("--rdzv-backend")->get_description();
  for (const char* name : {"crun (or c10d)", "etcd-v3 (or etcd)", "static"}) {
    CHECK_THAT(help, Catch::Contains(name));
  }
  CHECK(help.find("etcd-v2") == std::string::npos);
  CHECK_THAT(app.get_option("--rdzv-conf")->get_description(),
             Catch::Contains("with etcd-v3: etcd_prefix, etcd_user, etcd_password_file"));
}

TEST_CASE("backends: etcd's plan keeps its members, prefix and credentials", "[backends]") {
  crun::testing::TempDir dir;
  const std::string file = dir.path + "/password";
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs("s3cret\nignored\n", f);
    std::fclose(f);
  }
  const auto p =
      Plan({"--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1,[::1]:2380", "--rdzv-conf",
            "etcd_prefix=/jobs,etcd_user=root,etcd_password_file=" + file + ",etcd_retention=0"},
           DefaultBackends());
  REQUIRE(p.ok());
  CHECK(p->backend == "etcd-v3");
  CHECK(p->run_id == "default");
  const EtcdPlan* e = EtcdPlanOf(*p);
  REQUIRE(e != nullptr);
  REQUIRE(e->endpoints.size() == 2);
  CHECK(e->endpoints[0].port == 2379);
  CHECK(e->endpoints[1].port == 2380);
  CHECK(e->prefix == "/jobs");
  CHECK(e->user == "root");
  CHECK(e->password == "s3cret");
  CHECK(e->retention == std::chrono::seconds(0));
  // Unset: an hour.
  const auto fallback =
      Plan({"--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1"}, DefaultBackends());
  REQUIRE(fallback.ok());
  CHECK(EtcdPlanOf(*fallback)->retention == std::chrono::seconds(3600));
}
