// crun as the command of a Kubernetes pod (launcher/kubernetes.h, docs/kubernetes.md): each
// controller's variables, exactly as its source sets them, in the process's environment (the
// PET_* ones reach the flags through CLI11) and in the plan's; the plan or the refusal out.
#include <stdlib.h>

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "launcher/kubernetes.h"
#include "launcher/launch_plan.h"
#include "tests/unit/launcher/command_line.h"

namespace {

using namespace crun::launcher;
using Vars = std::map<std::string, std::string>;

// Sets `vars` in the process's environment for its lifetime (CLI11 reads PET_* there).
class PodEnvironment {
 public:
  explicit PodEnvironment(const Vars& vars) : vars_(vars) {
    for (const auto& [k, v] : vars_) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~PodEnvironment() {
    for (const auto& [k, v] : vars_) ::unsetenv(k.c_str());
  }
  PodEnvironment(const PodEnvironment&) = delete;
  PodEnvironment& operator=(const PodEnvironment&) = delete;

 private:
  Vars vars_;
};

// `crun [args] --no-python /bin/true` in a pod whose environment is `vars`.
crun::StatusOr<LaunchPlan> PlanInPod(const Vars& vars, std::vector<std::string> args = {}) {
  PodEnvironment env(vars);
  args.insert(args.end(), {"--no-python", "/bin/true"});
  const auto c = testing::ParseCommandLine(args);
  MachineFacts f;
  f.getenv = FromTable(vars);
  f.system_root = "/nonexistent-root";  // no GPUs
  f.cpus = 4;
  f.allowed_cpus = {0, 1, 2, 3};
  f.allowed_mems = {0};
  return PlanLaunch(c.o, c.given, f);
}

std::string Refusal(const Vars& vars, std::vector<std::string> args = {}) {
  auto p = PlanInPod(vars, std::move(args));
  return p.ok() ? "(accepted)" : p.status().message();
}

const Vars kPod = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}};

Vars InPod(Vars vars) {
  vars.insert(kPod.begin(), kPod.end());
  return vars;
}

}  // namespace

// Each controller's variable set for the pod of node 1 of 2, as found in its source (the
// table in docs/kubernetes.md); `crun train.py` with no flags must run there as node 1.
TEST_CASE("each controller's variables make the pod node 1 of 2", "[kubernetes]") {
  struct Row {
    const char* controller;
    Vars vars;
    const char* backend;
    const char* master_addr;  // the static backend's store host
    int master_port;
  };
  const std::vector<Row> rows = {
      // kubeflow/trainer, the torch plugin: PET_NODE_RANK from the pod's completion index.
      {"Kubeflow Trainer (torch runtime)",
       InPod({{"PET_NNODES", "2"},
              {"PET_NPROC_PER_NODE", "2"},
              {"PET_NODE_RANK", "1"},
              {"JOB_COMPLETION_INDEX", "1"},
              {"PET_MASTER_ADDR", "job-node-0-0.job"},
              {"PET_MASTER_PORT", "29400"}}),
       "static", "job-node-0-0.job", 29400},
      // training-operator, PyTorchJob with a Master replica, not elastic (newest): MASTER_ADDR and
      // MASTER_PORT without PET_, WORLD_SIZE and RANK as well.
      {"PyTorchJob",
       InPod({{"PYTHONUNBUFFERED", "0"},
              {"MASTER_ADDR", "job-master-0"},
              {"MASTER_PORT", "23456"},
              {"WORLD_SIZE", "2"},
              {"RANK", "1"},
              {"PET_NPROC_PER_NODE", "2"},
              {"PET_NNODES", "2"},
              {"PET_NODE_RANK", "1"}}),
       "static", "job-master-0", 23456},
      // The same controller before PET_NODE_RANK: RANK is the node rank inside a pod.
      {"PyTorchJob (RANK only)",
       InPod({{"MASTER_ADDR", "job-master-0"},
              {"MASTER_PORT", "23456"},
              {"WORLD_SIZE", "2"},
              {"RANK", "1"},
              {"PET_NPROC_PER_NODE", "2"},
              {"PET_NNODES", "2"}}),
       "static", "job-master-0", 23456},
      // An Indexed Job and a JobSet: only the index; the manifest sets the rest.
      {"Indexed Job",
       InPod({{"JOB_COMPLETION_INDEX", "1"},
              {"PET_NNODES", "2"},
              {"PET_NPROC_PER_NODE", "2"},
              {"PET_MASTER_ADDR", "train-0.train"},
              {"PET_MASTER_PORT", "29500"}}),
       "static", "train-0.train", 29500},
      {"JobSet",
       InPod({{"JOB_COMPLETION_INDEX", "1"},
              {"PET_NNODES", "2"},
              {"PET_NPROC_PER_NODE", "2"},
              {"PET_MASTER_ADDR", "js-workers-0-0.js"},
              {"PET_MASTER_PORT", "29500"}}),
       "static", "js-workers-0-0.js", 29500},
  };
  for (const auto& row : rows) {
    INFO(row.controller);
    auto p = PlanInPod(row.vars);
    REQUIRE(p.ok());
    CHECK(p->values.node_rank == 1);
    CHECK(p->node_rank_given);
    CHECK(p->values.settings.min_nodes == 2);
    CHECK(p->values.settings.max_nodes == 2);
    CHECK(p->nproc == 2);
    CHECK(p->backend == row.backend);
    CHECK(p->o.master_addr == row.master_addr);
    CHECK(p->values.master_port == row.master_port);
  }
}

TEST_CASE("an elastic PyTorchJob's pods rendezvous at its endpoint, ranks unimposed",
          "[kubernetes]") {
  // training-operator's elastic generator, older spelling of nproc included.
  const Vars vars = InPod({{"PET_RDZV_ENDPOINT", "127.0.0.1:23456"},
                           {"PET_RDZV_BACKEND", "c10d"},
                           {"PET_RDZV_ID", "job"},
                           {"PET_NNODES", "1:3"},
                           {"PET_MAX_RESTARTS", "3"},
                           {"PET_NPROC_PER_NODE", "2"},
                           {"PET_N_PROC_PER_NODE", "2"}});
  auto p = PlanInPod(vars);
  REQUIRE(p.ok());
  CHECK(p->backend == "crun");  // torchrun's c10d: crun's service
  CHECK(p->values.settings.min_nodes == 1);
  CHECK(p->values.settings.max_nodes == 3);
  CHECK_FALSE(p->node_rank_given);
  CHECK(p->values.settings.max_restarts == 3);
  REQUIRE(p->notes.size() == 1);
  CHECK(p->notes[0] ==
        "PET_N_PROC_PER_NODE=2 is not read (an older PyTorchJob's spelling, which torchrun never "
        "read either): crun reads PET_NPROC_PER_NODE");
}

TEST_CASE("a pod's index that cannot place the node is refused naming what to set",
          "[kubernetes]") {
  const Vars addr = {{"PET_MASTER_ADDR", "train-0.train"}, {"PET_MASTER_PORT", "29500"}};
  auto with = [&](Vars v) {
    v.insert(addr.begin(), addr.end());
    return InPod(std::move(v));
  };
  struct Row {
    Vars vars;
    const char* refusal;
  };
  for (const auto& row : std::vector<Row>{
           {with({{"JOB_COMPLETION_INDEX", "1"}}),
            "JOB_COMPLETION_INDEX=1 gives this pod's node rank but not the job's node count: "
            "set PET_NNODES in the pod's environment (docs/kubernetes.md)"},
           {InPod({{"JOB_COMPLETION_INDEX", "0"}, {"PET_NNODES", "2"}}),
            "JOB_COMPLETION_INDEX=0 gives this pod's node rank but not where node 0 is: set "
            "PET_MASTER_ADDR (pod 0's name under the job's headless Service) and "
            "PET_MASTER_PORT, or PET_RDZV_ENDPOINT (docs/kubernetes.md)"},
           {with({{"JOB_COMPLETION_INDEX", "x1"}, {"PET_NNODES", "2"}}),
            "JOB_COMPLETION_INDEX='x1' is not a node rank (0 to 100000)"},
           {with({{"JOB_COMPLETION_INDEX", "2"}, {"PET_NNODES", "2"}}),
            "JOB_COMPLETION_INDEX=2 is not below --nnodes 2"},
           {with({{"RANK", "3"}}),
            "RANK=3 gives this pod's node rank but not the job's node count: set PET_NNODES in "
            "the pod's environment (docs/kubernetes.md)"},
       }) {
    CHECK(Refusal(row.vars) == row.refusal);
  }
}

// RANK is a worker's as often as a pod's: it is read only in a pod, and neither it nor the
// pod's index is read by a crun that a worker started (a nested launch).
TEST_CASE("RANK is read only in a pod, and nothing of a worker's environment", "[kubernetes]") {
  const std::vector<std::string> two_nodes = {"--nnodes",      "2",    "--master-addr", "127.0.0.1",
                                              "--master-port", "29500"};
  auto outside = PlanInPod({{"RANK", "1"}, {"MASTER_ADDR", "elsewhere"}}, two_nodes);
  REQUIRE(outside.ok());
  CHECK(outside->values.node_rank == 0);
  CHECK_FALSE(outside->node_rank_given);
  CHECK(outside->o.master_addr == "127.0.0.1");

  const Vars worker = InPod({{"RANK", "3"},
                             {"LOCAL_RANK", "1"},
                             {"TORCHELASTIC_RUN_ID", "outer"},
                             {"MASTER_ADDR", "job-master-0"},
                             {"JOB_COMPLETION_INDEX", "1"}});
  auto nested = PlanInPod(worker, {"--standalone", "--nproc-per-node", "1"});
  REQUIRE(nested.ok());
  CHECK(nested->values.node_rank == 0);
  CHECK(nested->notes.empty());

  // An Indexed Job of independent one-node runs (a sweep): --standalone takes no index.
  auto sweep = PlanInPod(InPod({{"JOB_COMPLETION_INDEX", "7"}}), {"--standalone"});
  REQUIRE(sweep.ok());
  CHECK(sweep->values.node_rank == 0);

  // --node-rank (PET_NODE_RANK) comes before the index.
  auto flag = PlanInPod(InPod({{"JOB_COMPLETION_INDEX", "1"}}),
                        {"--node-rank", "0", "--nnodes", "2", "--master-addr", "127.0.0.1",
                         "--master-port", "29500"});
  REQUIRE(flag.ok());
  CHECK(flag->values.node_rank == 0);
}

TEST_CASE("what crun took from the pod is said in one line", "[kubernetes]") {
  auto p = PlanInPod(InPod({{"MASTER_ADDR", "job-master-0"},
                            {"MASTER_PORT", "23456"},
                            {"RANK", "1"},
                            {"PET_NNODES", "2"}}));
  REQUIRE(p.ok());
  REQUIRE(p->notes.size() == 1);
  CHECK(p->notes[0] ==
        "from the pod's environment: node rank 1 from RANK=1, node 0's store at "
        "MASTER_ADDR=job-master-0, MASTER_PORT=23456");
}

// The kubelet's SIGKILL comes 30 s after its SIGTERM unless the pod says otherwise: crun's stop
// (its workers' grace, and as long again on a static job's store host) must fit inside.
TEST_CASE("in a pod the workers' grace period fits Kubernetes' default", "[kubernetes]") {
  auto pod = PlanInPod(kPod, {"--standalone"});
  REQUIRE(pod.ok());
  CHECK(pod->agent.shutdown_timeout == std::chrono::milliseconds(14'000));
  auto given = PlanInPod(kPod, {"--standalone", "--shutdown-timeout", "5"});
  REQUIRE(given.ok());
  CHECK(given->agent.shutdown_timeout == std::chrono::milliseconds(5'000));
  auto env = PlanInPod(InPod({{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "20"}}), {"--standalone"});
  REQUIRE(env.ok());
  CHECK(env->agent.shutdown_timeout == std::chrono::milliseconds(20'000));
  auto outside = PlanInPod({}, {"--standalone"});
  REQUIRE(outside.ok());
  CHECK(outside->agent.shutdown_timeout == std::chrono::milliseconds(30'000));
}
