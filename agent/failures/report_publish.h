// Publishing a failure report where people and schedulers look: the text on stderr, the JSON
// in <log_dir>/failure.json (said where it went, or that it could not be written), and, when a
// scheduler gave crun a TORCHELASTIC_ERROR_FILE, the root cause's error there, as torchrun
// writes it. Formatting is report_format.h's.
#pragma once

#include <string>
#include <vector>

#include "agent/failures/report_format.h"

namespace crun::agent {

// `report` sorted by time, not empty: the first is the root cause.
void PublishReport(const ReportContext& context, const report::FailureReport& report,
                   const std::string& log_dir, const std::string& parent_error_file);

}  // namespace crun::agent
