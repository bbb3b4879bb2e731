// The goodput ledgers on etcd (docs/observability.md, "Goodput"), as crun's service keeps them:
// each node's own, from which the job's is combined (rendezvous/goodput/job_ledger.h), so that
// a decider that takes over has them all again. Pure: the keys' values and when to put them; no
// etcd call.
//
//   <prefix>ledger/<node id>  a node's ledger (ledger_json.h) without its marks (the snapshot
//                             saves and the step rate belong to the node's own timeline), not
//                             bound to its lease: a lost node's time stays in the job's
//   <prefix>a/goodput         the job's ledger as the decider combined it once the job had its
//                             outcome, without its segments: {"nodes": N, "job": {...}}; every
//                             node reads it at its end for the job's summary line
//
// The budget: a node puts its key when an incident begins or ends, when its workers first
// train, just before it reports its workers' end, and otherwise at most once every
// kLedgerRefresh (LedgerPuts), about three puts an incident and one a minute; a key holds at most
// kMaxSegments segments and kMaxIncidents incidents (about 400 KB at worst, a few KB for a job of a
// few incidents), and a/goodput no segments (its incidents are at most kMaxIncidents). The decider
// and `crun status` read the ledgers from what they already mirror; no node reads another's.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "rendezvous/etcd/job.h"
#include "rendezvous/goodput/job_ledger.h"

namespace crun::etcd {

inline constexpr std::chrono::seconds kLedgerRefresh{55};  // the agent shares each minute

std::string LedgerKey(const Keys& keys, const std::string& node_id);
std::string JobGoodputKey(const Keys& keys);

// A node's ledger as its key holds it: its marks left out.
std::string EncodeLedger(goodput::NodeLedger ledger);

// When a node puts its ledger: at once when what it says of the job changed (an incident
// begun or ended, the first training, the end), else once kLedgerRefresh has passed since
// the last put; and, whatever the marks, the last one offered just before the node reports
// its workers' end (Flush), so that the job's is combined from its nodes' ledgers as they were
// then.
class LedgerPuts {
 public:
  // The ledger as the agent shares it: the value to put now, or nothing (it is kept for
  // Flush).
  std::optional<std::string> Offer(Clock::time_point now, const goodput::NodeLedger& ledger);
  // The last value offered and not put, if any.
  std::optional<std::string> Flush() { return std::exchange(held_, std::nullopt); }

 private:
  struct Marks {
    std::size_t incidents = 0, resumed = 0;
    bool trained = false, finished = false;
    bool operator==(const Marks&) const = default;
  };
  std::optional<Clock::time_point> last_;
  Marks marks_;
  std::optional<std::string> held_;  // offered, not put
};

// Every node's ledger under the prefix; with `wall`, as of then: a node still in the job (its
// nodes/ key) whose ledger has not finished is carried on in the category it was last in.
// Values that cannot be read are left out, each named in `skipped`.
std::vector<goodput::NodeLedger> Ledgers(const Keys& keys, const Mirror& mirror,
                                         std::optional<WallClock::time_point> wall,
                                         std::vector<std::string>* skipped = nullptr);

// a/goodput: the job combined from `nodes` nodes, its segments left out.
std::string EncodeJobGoodput(goodput::JobLedger job, std::size_t nodes);
struct JobGoodput {
  goodput::JobLedger job;  // without segments or nodes
  std::size_t nodes = 0;
};
StatusOr<JobGoodput> DecodeJobGoodput(const std::string& text);

}  // namespace crun::etcd
