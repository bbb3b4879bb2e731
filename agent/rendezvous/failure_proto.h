// A node's failure report on the wire (crun.v1.FailureReport): what an agent sends when its
// workers fail, and what every node reads back as the job's root cause. Shared by the
// rendezvous clients of crun's service and of etcd.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/failure_report.h"
#include "crun/v1/rendezvous.pb.h"

namespace crun::agent {

v1::FailureReport FailureReportToProto(const std::string& node_id,
                                       const std::vector<FailureRecord>& failures);
std::vector<FailureRecord> FailureReportFromProto(const v1::FailureReport& report);

// The report as protobuf's JSON mapping writes crun.v1.FailureReport (names as in the .proto,
// fields at their default left out, an int64 as a string): how the etcd rendezvous keeps it, a
// document `etcdctl get` shows readably. Written here because crun's messages are lite (no
// reflection, hence no protobuf JSON). Text that is not UTF-8 (a worker's stderr) comes out
// with U+FFFD in place of the bad bytes.
std::string FailureReportToJson(const v1::FailureReport& report);
// Back, from what FailureReportToJson or protobuf's JSON printer wrote (an int64 as a string or
// a number); nullopt for anything else.
std::optional<v1::FailureReport> FailureReportFromJson(const std::string& text);

}  // namespace crun::agent
