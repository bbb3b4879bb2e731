// A job's goodput at the service (docs/observability.md, "Goodput"): each node's ledger as the
// node last sent it (rendezvous/goodput/ledger_json.h), carried to now for a node that still
// runs, combined into the job's (job_ledger.h) for `crun status`, the metrics and the job's end.
// Nothing else is kept: a daemon that restarts has it back as the nodes send their ledgers to
// their new sessions.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "rendezvous/goodput/job_ledger.h"
#include "rendezvous/rules/rules.h"
#include "rendezvous/service/messages.h"

namespace crun::rdzv {

class JobGoodput {
 public:
  // Node `node_id`'s ledger, as JSON; an error names what is wrong, and the last one stays.
  Status Received(const std::string& node_id, const std::string& json, TimePoint now);

  // Every node's ledger as of `now`: those in `live` (a session open, the ledger not
  // finished) carried on in the category they were in; the others as they last said.
  std::vector<goodput::NodeLedger> AsOf(TimePoint now, const std::set<std::string>& live) const;
  bool empty() const { return nodes_.empty(); }

 private:
  struct Held {
    goodput::NodeLedger ledger;
    TimePoint received;
  };
  std::map<std::string, Held> nodes_;
};

// What `crun status` shows of a ledger (a job's, a node's).
msg::GoodputFigures FiguresOf(const goodput::Totals& totals, std::size_t incidents,
                              bool steps_known, bool progress_known);

}  // namespace crun::rdzv
