// A node's failure report on the wire (crun.v1.FailureReport): what an agent sends when its
// workers fail, and what every node reads back as the job's root cause. Shared by the
// rendezvous clients of crun's service and of etcd.
#pragma once

#include <string>
#include <vector>

#include "agent/failure_report.h"
#include "crun/v1/rendezvous.pb.h"

namespace crun::agent {

v1::FailureReport FailureReportToProto(const std::string& node_id,
                                       const std::vector<FailureRecord>& failures);
std::vector<FailureRecord> FailureReportFromProto(const v1::FailureReport& report);

}  // namespace crun::agent
