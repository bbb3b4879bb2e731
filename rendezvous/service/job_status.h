// What the rendezvous says of a job, whichever keeps it (the engine, or etcd: rendezvous/etcd):
// its status as `crun status` shows it. (Its failure in words and as an exit code:
// rendezvous/report/report.h.) Plain C++ over messages.h, like the rules.
#pragma once

#include <string>

#include <vector>

#include "rendezvous/goodput/job_ledger.h"
#include "rendezvous/rules/rules.h"
#include "rendezvous/service/messages.h"

namespace crun::rdzv {

// One job as Status shows it: `state` and what is kept beside it.
msg::JobStatus DescribeJob(const std::string& run_id, const State& state, int world_size,
                           const std::string& last_failure, TimePoint now);

// The job's goodput, combined from its nodes' ledgers, and each node's, into `job` (nothing
// where no node sent one).
void DescribeGoodput(const std::vector<goodput::NodeLedger>& nodes, msg::JobStatus& job);

}  // namespace crun::rdzv
