// What a `crun` command line means, decided before anything happens: the rendezvous mode, the
// Slurm step's part, the service's settings and every option of the agent. PlanLaunch reads
// the machine only through MachineFacts (the environment, the Slurm step in it, CPUs, GPUs,
// NUMA), the files the options name (the script, the job token and TLS files) and the
// resolver (does the endpoint exist, does it name this host); it creates nothing, starts
// nothing and changes no environment. RunLaunch (launch_command.cc) acts on the plan.
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/agent_options.h"
#include "base/endpoint.h"
#include "base/security.h"
#include "base/status.h"
#include "launcher/launch_options.h"
#include "launcher/slurm.h"
#include "rendezvous/service/rules.h"

namespace crun::launcher {

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

// Which rendezvous: one node in-process, torchrun's static backend, crun's service, or etcd.
enum class Mode { kLocal, kStatic, kService, kEtcd };

struct LaunchPlan {
  LaunchOptions o;  // as given, with what Slurm fills in (nnodes, endpoint, run id)
  Mode mode = Mode::kLocal;
  NodeRange nodes;
  int nproc = 1;
  int max_restarts = 0;
  int node_rank = 0;
  bool node_rank_given = false;
  int master_port = -1;                         // -1: a fresh free port per attempt
  std::optional<SlurmNodeSettings> slurm;       // one crun per node of a Slurm step
  std::optional<SlurmTaskSettings> slurm_task;  // one crun per Slurm task
  Endpoint endpoint;                            // the service's (kService)
  std::vector<Endpoint> etcd_endpoints;         // etcd's members (kEtcd)
  std::string etcd_password;                    // from --rdzv-conf etcd_password_file
  RdzvConf conf;
  rdzv::Settings settings;  // the service's defaults, overridden by --rdzv-conf
  std::chrono::milliseconds heartbeat_interval{1000};
  bool try_host = false;  // whether this node hosts the service (or joins the one on its port)
  Security security;
  std::string run_id;
  agent::AgentOptions agent;       // without host_name and log_dir, known when acted on
  std::vector<std::string> notes;  // said on stderr once the plan is acted on
};

// Every spelling of each option given on `app`'s command line (or by its PET_* variable).
std::set<std::string> GivenFlags(const CLI::App& app);

// The plan, or the first error, naming the flag and value: "--node-rank 2 is not below
// --nnodes 2".
StatusOr<LaunchPlan> PlanLaunch(LaunchOptions o, const std::set<std::string>& given,
                                const MachineFacts& facts);

}  // namespace crun::launcher
