// PlanLaunch: command lines (and a Slurm step's variables) in, the plan or the refusal out.
// The machine is a made-up one (MachineFacts): 8 CPUs, no GPUs, the environment a table; the
// Slurm step's nodes are loopback addresses. The worker is /bin/true with --no-python, so
// nothing but the resolver (for literals and "localhost") and the file system is asked.
#include <stdlib.h>

#include <catch2/catch.hpp>

#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "launcher/backends/etcd.h"
#include "launcher/backends/service.h"
#include "launcher/backends/static.h"
#include "launcher/launch_plan.h"
#include "tests/unit/launcher/command_line.h"

namespace {

using namespace crun::launcher;
using Strings = std::vector<std::string>;
using Vars = std::map<std::string, std::string>;

MachineFacts Facts(Vars vars = {}) {
  MachineFacts f;
  f.getenv = FromTable(std::move(vars));
  f.system_root = "/nonexistent-root";  // no /dev/nvidia*: no GPUs
  f.cpus = 8;
  f.allowed_cpus = {0, 1, 2, 3, 4, 5, 6, 7};
  f.allowed_mems = {0};
  return f;
}

// Parses `args` (options only; "--no-python /bin/true" is appended) as crun's command line.
crun::StatusOr<LaunchPlan> Plan(const Strings& args, const Vars& vars = {}) {
  Strings words = args;
  words.insert(words.end(), {"--no-python", "/bin/true", "x"});
  const auto c = testing::ParseCommandLine(words);
  return PlanLaunch(c.o, c.given, Facts(vars));
}

// The same for a Python worker: any readable file that is not a native program is a script.
crun::StatusOr<LaunchPlan> PlanPython(const Strings& args) {
  Strings words = args;
  words.push_back("/etc/passwd");
  const auto c = testing::ParseCommandLine(words);
  return PlanLaunch(c.o, c.given, Facts({{"PYTHON_EXEC", "/usr/bin/python3"}}));
}

std::string Refusal(const Strings& args, const Vars& vars = {}) {
  const auto p = Plan(args, vars);
  return p.ok() ? "(accepted)" : p.status().message();
}

Vars StepVars() {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "3"},
          {"SLURM_STEP_NODELIST", "127.0.0.[1-3]"},
          {"SLURM_NODEID", "1"},
          {"SLURM_PROCID", "3"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_STEP_NUM_TASKS", "6"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x3)"}};
}

}  // namespace

TEST_CASE("plan: the backend follows torchrun's rules", "[plan]") {
  struct Row {
    Strings args;
    std::string backend;
    bool static_nodes;  // torchrun's static backend over several nodes
    int min_nodes, max_nodes;
  };
  for (const Row& row : {
           Row{{}, "static", false, 1, 1},
           Row{{"--standalone"}, "static", false, 1, 1},
           Row{{"--standalone", "--nnodes", "1:2"}, "static", false, 1, 1},
           Row{{"--nnodes", "2", "--master-port", "29500"}, "static", true, 2, 2},
           Row{{"--rdzv-endpoint", "127.0.0.1:29400"}, "crun", false, 1, 1},
           Row{{"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "127.0.0.1,[::1]:2380", "--nnodes",
                "2:4"},
               "etcd-v3",
               false,
               2,
               4},
           Row{{"--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost"},
               "crun",
               false,
               1,
               4},
           Row{{"--nnodes", "2", "--rdzv-backend", "static", "--master-port", "1"},
               "static",
               true,
               2,
               2},
       }) {
    INFO(Catch::Detail::stringify(row.args));
    const auto p = Plan(row.args);
    REQUIRE(p.ok());
    CHECK(p->backend == row.backend);
    CHECK(PlansStaticNodes(*p) == row.static_nodes);
    CHECK(p->values.settings.min_nodes == row.min_nodes);
    CHECK(p->values.settings.max_nodes == row.max_nodes);
  }
}

TEST_CASE("plan: refusals name the flag and the value", "[plan]") {
  struct Row {
    Strings args;
    std::string message;
  };
  for (const Row& row : {
           Row{{"--rdzv-endpoint", ""}, "--rdzv-endpoint is empty (an unset variable?)"},
           Row{{"--role", ""}, "--role is empty"},
           Row{{"--max-restarts", "-1"}, "--max-restarts '-1'"},
           Row{{"--start-method", "thread"}, "--start-method 'thread': expected spawn, fork"},
           Row{{"--event-log-handler", "x"}, "--event-log-handler 'x'"},
           Row{{"--logs-specs", "mine"}, "--logs-specs 'mine'"},
           Row{{"--rdzv-backend", "etcd"},
               "--rdzv-backend etcd needs --rdzv-endpoint with etcd's members"},
           Row{{"--rdzv-backend", "etcd-v2"}, "etcd's v2 API is gone from etcd 3.6"},
           Row{{"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "localhost:2379,,localhost"},
               "--rdzv-endpoint 'localhost:2379,,localhost'"},
           Row{{"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "localhost:2379", "--rdzv-conf",
                "etcd_user=root"},
               "etcd_user=root needs etcd_password_file=PATH"},
           Row{{"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "localhost:2379", "--token-file",
                "/etc/hostname"},
               "--token-file secures crun's rendezvous service; etcd checks its own users"},
           Row{{"--rdzv-endpoint", "localhost:29400", "--rdzv-conf", "etcd_prefix=/x"},
               "--rdzv-conf etcd_prefix is for --rdzv-backend etcd-v3, not crun"},
           Row{{"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "localhost", "--rdzv-conf",
                "etcd_prefix=x"},
               "etcd_prefix='x' must start with '/'"},
           Row{{"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "localhost", "--rdzv-conf",
                "etcd_retention=1h"},
               "--rdzv-conf: etcd_retention='1h' is not a whole number of seconds from 0"},
           Row{{"--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "localhost", "--rdzv-conf",
                "etcd_retention=-5"},
               "etcd_retention='-5' is not a whole number of seconds from 0 (keep a finished "
               "job's keys until removed by hand) to 31622400 (a year)"},
           Row{{"--rdzv-backend", "zk"},
               "--rdzv-backend 'zk': expected crun (or c10d), etcd-v3 (or etcd) or static"},
           Row{{"--rdzv-backend", "statik"}, "or static (did you mean static?)"},
           Row{{"--rdzv-backend", "c10d"}, "--rdzv-backend c10d needs --rdzv-endpoint"},
           Row{{"--standalone", "--nnodes", "2"}, "--standalone runs one node; --nnodes '2'"},
           Row{{"--nnodes", "1:2", "--master-port", "1"}, "the static backend needs a fixed"},
           Row{{"--nnodes", "2", "--node-rank", "2", "--master-port", "1"},
               "--node-rank 2 is not below --nnodes 2"},
           Row{{"--nnodes", "2"}, "the static backend needs --master-port"},
           Row{{"--node-rank", "1"}, "--node-rank 1 on a one-node job"},
           Row{{"--rdzv-endpoint", "no-such-host.invalid"},
               "--rdzv-endpoint: cannot resolve host 'no-such-host.invalid'"},
           Row{{"--rdzv-endpoint", "127.0.0.1", "--rdzv-conf",
                "heartbeat_interval=5,"
                "heartbeat_timeout=5"},
               "heartbeat_interval (5000 ms) must be shorter"},
           Row{{"--token-file", "/etc/passwd"}, "--token-file secures crun's rendezvous"},
           Row{{"--slurm-port", "5000"}, "--slurm-port 5000 without a Slurm step"},
           Row{{"--shutdown-timeout", "nan"}, "--shutdown-timeout 'nan'"},
           Row{{"--signals-to-handle", "SIGKILL"}, "SIGKILL"},
           Row{{"--nproc-per-node", "gpu"}, "gpu"},
           Row{{"--tee", "0:9"}, "--tee '0:9'"},
           Row{{"--straggler-action", "exclude"},
               "--straggler-action exclude: the static rendezvous cannot go on without a node"},
           Row{{"--standalone", "--straggler-action", "exclude"},
               "--straggler-action exclude: the --standalone rendezvous cannot go on"},
           Row{{"--nnodes", "2", "--master-port", "1", "--straggler-action", "exclude"},
               "the static rendezvous cannot go on without a node"},
           Row{{"--unhealthy-nodes-file", "/tmp/x"},
               "--unhealthy-nodes-file /tmp/x needs --health-check or --straggler-action exclude"},
       }) {
    INFO(Catch::Detail::stringify(row.args));
    CHECK_THAT(Refusal(row.args), Catch::Contains(row.message));
  }
}

TEST_CASE("plan: the agent's options come from the flags and torchrun's variables", "[plan]") {
  const auto p = Plan({"--nproc-per-node", "cpu", "--max-restarts", "3", "--tee", "3",
                       "--signals-to-handle", "SIGTERM,SIGUSR1", "--event-log-handler", "console"},
                      {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "2.5"},
                       {"TORCHELASTIC_ERROR_FILE", "/tmp/e.json"},
                       {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${rank}>"}});
  REQUIRE(p.ok());
  const auto& a = p->agent;
  CHECK(p->nproc == 8);
  CHECK(a.nproc == 8);
  CHECK(a.max_restarts == 3);
  CHECK(a.command == Strings{"/bin/true", "x"});
  CHECK(a.interpreter.empty());
  CHECK(a.forward_signals == std::vector<int>{SIGTERM, SIGUSR1});
  CHECK(a.shutdown_timeout == std::chrono::milliseconds(2500));
  CHECK(a.tees == std::vector<int>(8, 3));
  CHECK(a.torchelastic_events);
  CHECK(a.parent_error_file == "/tmp/e.json");
  CHECK(a.prefix_template == "${rank}>");
  // One node without --master-port: a fresh run id, as torchrun 2.x's standalone switch.
  CHECK(p->run_id.size() == 16);
  CHECK(Plan({"--nnodes", "2", "--master-port", "1"})->run_id == "none");
  CHECK(Plan({"--rdzv-endpoint", "127.0.0.1"})->run_id == "default");
}

TEST_CASE("plan: snapshots go to a peer and a disk of this job's own", "[plan]") {
  // Copies to the next node: only where a round can have several nodes, and not when off.
  ::setenv("CRUN_TOKEN", "job-secret", 1);  // the token is read where the backend loads it
  const auto two = Plan({"--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29400"});
  ::unsetenv("CRUN_TOKEN");
  REQUIRE(two.ok());
  CHECK(two->agent.snapshot_replicas);
  CHECK(two->agent.snapshot_security.token == "job-secret");
  CHECK_FALSE(two->agent.snapshot_security.tls());  // no TLS in this job: copies as plain TCP
  CHECK(two->agent.snapshot_disk.job == "10.0.0.1:29400 default");
  CHECK_FALSE(Plan({"--standalone"})->agent.snapshot_replicas);
  CHECK(Plan({"--standalone"})->agent.snapshot_disk.job.empty());  // a job of its own
  CHECK_FALSE(Plan({"--nnodes", "2", "--rdzv-endpoint", "10.0.0.1", "--snapshot-replicas", "off"})
                  ->agent.snapshot_replicas);
  CHECK_FALSE(Plan({"--nnodes", "2", "--rdzv-endpoint", "10.0.0.1", "--snapshots", "off"})
                  ->agent.snapshot_replicas);
  const auto bad = Plan({"--snapshot-replicas", "maybe"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "--snapshot-replicas 'maybe' is not valid: expected on or off");
  // The static backend: the nodes share node 0's store, and say so.
  CHECK(Plan({"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.9", "--master-port",
              "29500"})
            ->agent.snapshot_disk.job == "10.0.0.9:29500 none");
}

TEST_CASE("plan: the service's settings and whether this node hosts it", "[plan]") {
  const auto p =
      Plan({"--nnodes", "2:3", "--max-restarts", "2", "--rdzv-endpoint", "127.0.0.1:4000",
            "--rdzv-conf", "join_timeout=7,last_call_timeout=0.5,heartbeat_timeout=9,x=1"});
  REQUIRE(p.ok());
  const ServicePlan* service = ServicePlanOf(*p);
  REQUIRE(service != nullptr);
  CHECK(service->endpoint.host == "127.0.0.1");
  CHECK(service->endpoint.port == 4000);
  CHECK(p->values.settings.min_nodes == 2);
  CHECK(p->values.settings.max_nodes == 3);
  CHECK(p->values.settings.max_restarts == 2);
  CHECK(p->values.settings.join_timeout == std::chrono::seconds(7));
  CHECK(p->values.settings.last_call_timeout == std::chrono::milliseconds(500));
  CHECK(p->heartbeat_interval == std::chrono::seconds(1));
  CHECK(service->try_host);  // 127.0.0.1 is this host
  REQUIRE(p->notes.size() == 1);
  CHECK_THAT(p->notes[0], Catch::Contains("ignoring unknown key 'x'"));
  // TEST-NET-3 is nobody's interface: this node joins.
  CHECK_FALSE(ServicePlanOf(*Plan({"--rdzv-endpoint", "203.0.113.7"}))->try_host);
  CHECK(ServicePlanOf(*Plan({"--rdzv-endpoint", "203.0.113.7", "--rdzv-conf", "is_host=1"}))
            ->try_host);
}

TEST_CASE("plan: a Slurm step fills in the nodes, or the ranks of one task", "[plan][slurm]") {
  const auto node = Plan({}, StepVars());  // inside a step, nothing names the nodes: --slurm
  REQUIRE(node.ok());
  REQUIRE(node->slurm.has_value());
  CHECK(node->backend == "crun");
  CHECK(node->values.settings.max_nodes == 3);
  CHECK(node->values.node_rank == 1);
  CHECK(node->node_rank_given);
  CHECK(node->run_id == "slurm-4242.3");
  CHECK_FALSE(ServicePlanOf(*node)->try_host);  // 127.0.0.2 is not the step's first node
  CHECK(node->o.rdzv_endpoint.rfind("127.0.0.1:", 0) == 0);
  CHECK(node->values.rdzv_conf.node_id == "127.0.0.2");
  // Slurm's warning signals reach the workers unless the user chose the signals.
  CHECK(node->agent.forward_signals.size() == 6);

  const auto task = Plan({"--slurm-direct"}, StepVars());
  REQUIRE(task.ok());
  REQUIRE(task->slurm_task.has_value());
  CHECK(task->backend == "static");
  CHECK_FALSE(PlansStaticNodes(*task));
  CHECK(task->slurm_task->rank == 3);
  CHECK(task->agent.first_local_rank == 1);
  CHECK(task->run_id == "slurm-4242.3");

  CHECK_THAT(Refusal({"--slurm-direct", "--nnodes", "2"}, StepVars()),
             Catch::Contains("--slurm-direct takes the ranks from the Slurm task"));
  CHECK_THAT(Refusal({"--slurm-direct", "--nproc-per-node", "2"}, StepVars()),
             Catch::Contains("not --nproc-per-node 2"));
  CHECK_THAT(Refusal({"--slurm-direct", "--max-restarts", "1"}, StepVars()),
             Catch::Contains("restarts belong to Slurm"));
  CHECK_THAT(Refusal({"--slurm", "--nnodes", "2"}, StepVars()),
             Catch::Contains("--slurm takes the nodes from the Slurm step"));
  CHECK_THAT(Refusal({"--slurm"}), Catch::Contains("--slurm: "));
  // Outside a step nothing is read from Slurm.
  CHECK_FALSE(Plan({})->slurm.has_value());
}

TEST_CASE("plan: --warm is for Python workers, with the template's modules named", "[plan]") {
  const Strings defaults{"torch?", "torch.distributed?", "torch.nn.parallel?", "torch._dynamo?"};
  CHECK(PlanPython({})->agent.warm_modules.empty());
  CHECK(PlanPython({"--warm"})->agent.warm_modules == defaults);
  Strings more = defaults;
  more.insert(more.end(), {"transformers", "my_project.model"});
  CHECK(PlanPython({"--warm", "--warm-modules", "transformers,my_project.model"})
            ->agent.warm_modules == more);
  // A native program starts cold (crun says so once on stderr).
  CHECK(Plan({"--warm"})->agent.warm_modules.empty());
  for (const char* bad : {"bad-name", "1torch", "torch.", ".torch", "a b"}) {
    const auto p = PlanPython({"--warm", "--warm-modules", std::string("torch,") + bad});
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().message() ==
          "--warm-modules: '" + std::string(bad) + "' is not a Python module name");
  }
  const auto without = PlanPython({"--warm-modules", "torch"});
  REQUIRE_FALSE(without.ok());
  CHECK(without.status().message() == "--warm-modules needs --warm");
}
