// What a `crun` command line means (plan.h), decided before anything happens. PlanLaunch chooses
// the rendezvous backend from the table (backends/backend.h) and hands it the plan. It reads
// the machine only through MachineFacts (the environment, the Slurm step in it, CPUs, GPUs,
// NUMA), the files the options name (the script, the job token and TLS files) and the
// resolver (does the endpoint exist, does it name this host); it creates nothing, starts
// nothing and changes no environment. RunLaunch (launch_command.cc) acts on the plan.
#pragma once

#include <set>
#include <string>

#include "base/status.h"
#include "launcher/backends/backend.h"
#include "launcher/plan.h"

namespace crun::launcher {

// Every spelling of each option given on `app`'s command line (or by its PET_* variable).
std::set<std::string> GivenFlags(const CLI::App& app);

// The plan, or the first error, naming the flag and value: "--node-rank 2 is not below
// --nnodes 2". The backend is one of `backends`.
StatusOr<LaunchPlan> PlanLaunch(LaunchOptions o, const std::set<std::string>& given,
                                const MachineFacts& facts,
                                const Backends& backends = DefaultBackends());

}  // namespace crun::launcher
