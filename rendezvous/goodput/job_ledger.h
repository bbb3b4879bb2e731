// The job's goodput ledger, rebuilt from its nodes' (ledger.h) and from nothing else, so that a
// rendezvous that restarts rebuilds it from what its nodes send again. At each instant the job
// trains only when every member node does; otherwise the instant goes to the node that holds
// the job back most, in this order: detecting, restarting, waiting, starting, reloading,
// redone. A spare's wait holds nothing back; an instant no member node accounts for (a node
// lost after its last report, and no other) is waiting. Once the job has trained, a node
// starting (a replacement) is the job restarting. Node clocks that disagree move the
// boundaries by their skew only. Incidents of the nodes that overlap are one incident of the
// job, named by the earliest fault; its costs are the job's categories from that fault until
// the job trains new steps again.
#pragma once

#include <string>
#include <vector>

#include "rendezvous/goodput/ledger.h"

namespace crun::goodput {

struct JobLedger {
  Ms begin = 0, until = 0;      // the earliest launch, the latest figure
  Totals totals{};              // sum to until - begin
  bool steps_known = false;     // the workers report step numbers (on a node that ran some)
  bool progress_known = false;  // the workers report progress
  bool finished = false;        // every node finished
  std::vector<Segment> segments;
  std::vector<Incident> incidents;
  std::vector<NodeLedger> nodes;  // in node id order
};

JobLedger Combine(std::vector<NodeLedger> nodes);

// `node` carried on to `until` in the category it was last in: a node that runs and has not
// said more since (its ledger arrives at a low rate). Nothing for a finished ledger, or one
// already as of `until` or later.
void CarryOn(NodeLedger& node, Ms until);

// training / wall time, 0 for no time.
double Goodput(const Totals& totals);

// The figures in a line, for the end of a job:
//   "goodput 96.2 % (57 m 40 s of 59 m 57 s training); starting 25 s; 3 incidents cost
//    1 m 52 s: detecting 9 s, restarting 2 s, reloading 6 s, redone 24 s, waiting 1 m 11 s"
// and what cannot be known ("redone: unknown, the workers report no steps").
std::string Summary(const Totals& totals, std::size_t incidents, bool steps_known,
                    bool progress_known);
std::string Summary(const JobLedger& job);
std::string Summary(const NodeLedger& node);

// "1 h 2 m", "57 m 40 s", "25 s", "0.4 s".
std::string Spoken(Ms ms);

}  // namespace crun::goodput
