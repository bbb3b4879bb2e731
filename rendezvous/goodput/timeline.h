// The goodput timeline, a picture (docs/observability.md, "The timeline"): one self-contained
// HTML page, inline SVG and CSS, no script, nothing fetched. The job's lane on top, then a lane
// per node with its phases coloured by category; each incident of the job marked with its kind
// and cause in its tooltip (an SVG <title>); snapshot saves as ticks; each node's step rate
// below; the totals as a table whose figures are the JSON's (ledger_json.h).
//
// Served live at /goodput by each crun's and the daemon's HTTP port (--metrics-port), written
// to the log directory at the job's end, and drawn from a --goodput-file by `crun timeline`.
#pragma once

#include <string>

#include "rendezvous/goodput/job_ledger.h"

namespace crun::goodput {

// `title` names the job (its run id).
std::string RenderTimeline(const JobLedger& job, const std::string& title);

}  // namespace crun::goodput
