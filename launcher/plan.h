// What a `crun` command line means, as data: the rendezvous backend and what it decided
// (launcher/backends/), the Slurm step's part, the rendezvous settings and every option of the
// agent. PlanLaunch (launch_plan.h) decides it; the backends' plans fill their part of it;
// RunLaunch (launch_command.cc) acts on it. Below the backends: it names none of them.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_options.h"
#include "base/security.h"
#include "launcher/launch_options.h"
#include "launcher/launch_values.h"
#include "launcher/slurm.h"
#include "rendezvous/rules/rules.h"

namespace crun::launcher {

class BackendRun;  // backends/backend.h: what the chosen backend decided

// What the plan may know of the machine; OfThisMachine() reads it, tests make their own.
struct MachineFacts {
  Getenv getenv;               // the environment; empty: std::getenv
  std::string system_root;     // where /dev and /sys are read (CRUN_SYSTEM_ROOT)
  int cpus = 1;                // online
  std::set<int> allowed_cpus;  // this process's affinity
  std::set<int> allowed_mems;  // the NUMA nodes its cpuset allows
  static MachineFacts OfThisMachine();

  std::optional<std::string> Env(const char* name) const;
};

struct LaunchPlan {
  LaunchOptions o;  // as given, with what Slurm fills in (nnodes, endpoint, run id)
  // o's values, parsed once (ParseLaunchValues), with what Slurm, a pod or --standalone fill in
  // (settings' nodes, node_rank, master_port, rdzv_conf's is_host and node_id): the plan decides
  // from them and holds no copy of them.
  LaunchValues values;
  std::string backend;                     // the chosen entry's name: "static", "crun", ...
  std::shared_ptr<BackendRun> rendezvous;  // what that entry decided; Open()ed when acted on
  int nproc = 1;  // --nproc-per-node resolved on this machine (cpu, gpu, auto)
  bool node_rank_given = false;
  std::string node_rank_from;  // "JOB_COMPLETION_INDEX=2" when a pod gave it; empty: the flag
  std::optional<SlurmNodeSettings> slurm;       // one crun per node of a Slurm step
  std::optional<SlurmTaskSettings> slurm_task;  // one crun per Slurm task
  std::chrono::milliseconds heartbeat_interval{1000};
  Security security;  // the rendezvous's job token and TLS, as its backend loaded them
  std::string run_id;
  agent::AgentOptions agent;       // without host_name and log_dir, known when acted on
  std::vector<std::string> notes;  // said on stderr once the plan is acted on
};

}  // namespace crun::launcher
