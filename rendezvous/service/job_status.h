// What the rendezvous says of a job, whichever keeps it (the engine, or etcd: rendezvous/etcd):
// its status as `crun status` shows it, and its failure in words and as an exit code. Plain
// C++ over messages.h, like the rules.
#pragma once

#include <string>

#include "rendezvous/service/messages.h"
#include "rendezvous/service/rules.h"

namespace crun::rdzv {

// One job as Status shows it: `state` and what is kept beside it.
msg::JobStatus DescribeJob(const std::string& run_id, const State& state, int world_size,
                           const std::string& last_failure, TimePoint now);

// "rank 3 (local rank 1) on node-b failed with exit code 2: ValueError: ..."
std::string Describe(const msg::FailureReport& report);
// The shell code of the report's first failure (exit code, or 128 + signal); 1 if none.
int ExitCodeOf(const msg::FailureReport& report);

}  // namespace crun::rdzv
