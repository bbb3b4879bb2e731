// Publishing a failure report where people and schedulers look: the text on stderr, the JSON
// in <log_dir>/failure.json (said where it went, or that it could not be written), and, when a
// scheduler gave crun a TORCHELASTIC_ERROR_FILE, the root cause's error there, as torchrun
// writes it. Formatting is report_format.h's.
#pragma once

#include <string>
#include <vector>

#include "agent/failures/attempt_failures.h"
#include "agent/failures/report_format.h"
#include "agent/rendezvous/rendezvous.h"

namespace crun::agent {

// `report` sorted by time, not empty: the first is the root cause.
void PublishReport(const ReportContext& context, const report::FailureReport& report,
                   const std::string& log_dir, const std::string& parent_error_file);

// What a node publishes when its job ends: the report of `failures` (this node's, the context
// says whose attempt), or the root cause's from `outcome`.
struct JobEnd {
  ReportContext context;  // without `hang`: the failures say which report had one
  const AttemptFailures& failures;
  std::string node_id;  // this node's, as the rendezvous names it
  std::string log_dir, parent_error_file;
};

// `report` published with its hang, if the attempt had one.
void PublishFailures(const JobEnd& end, const report::FailureReport& report);
// The job is over with `outcome`: nothing for a success; for a failure, this node's full
// report when its failure ended the job (the same root cause first), else the root node's
// report (and whose it was), else the reason alone.
void PublishOutcome(const JobEnd& end, const JobOutcome& outcome);

}  // namespace crun::agent
