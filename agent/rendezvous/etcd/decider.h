// The etcd rendezvous's decider role: the agent holding a/decider folds what its mirror of the
// run's keys says (joins, reports, lost nodes, deadlines) into the job document with the
// rendezvous rules (rendezvous/etcd/job.h's Decide, pure) and writes it in a transaction that
// compares the document's revision, so that a decider that lost its place cannot overwrite
// its successor's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/job.h"

namespace crun::agent {

struct DecideResult {
  // The revision of the document it wrote: decide again only once the mirror has reached it.
  // 0 when it wrote nothing (nothing changed, a lost race, or etcd did not answer).
  std::int64_t written_revision = 0;
  std::optional<rdzv::TimePoint> wake_at;  // decide again then, if nothing else happens first
  std::vector<std::string> log;            // what was decided, once written
  Status error;       // the mirror cannot be decided on: the job ends (a corrupt or foreign doc)
  Status unanswered;  // etcd did not take the write (an outage): wake_at is soon
};

// One decision on `mirror` at `now` by the node `self` (a/decider), written if the document
// changed; a round's ranks/ records first (etcd/job.h, Decision::rank_ops).
// A job that ended gets its retention lease here (etcd/job.h, Retention), granted with
// `retention`'s TTL.
DecideResult DecideAndWrite(etcd::Client& client, const etcd::Keys& keys,
                            const etcd::Mirror& mirror, const std::string& self,
                            rdzv::TimePoint now, etcd::Clock::time_point deadline,
                            std::chrono::seconds retention = etcd::kDefaultRetention);

}  // namespace crun::agent
