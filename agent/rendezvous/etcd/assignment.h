// The etcd rendezvous's assignment role: what a node makes of the job document the decider
// publishes (rendezvous/etcd/job.h) and of its own ranks/ record, and how its own failure goes
// into its report/ record. Pure (but for a log line): the document, the record and who this node is
// in, its group assignment for the round out, or nothing when the record is not of the round the
// document announces; the job's outcome out of the document.
#pragma once

#include <optional>
#include <string>

#include "agent/rendezvous/assignment.h"
#include "agent/rendezvous/rendezvous.h"
#include "rendezvous/etcd/job.h"
#include "rendezvous/report/report.h"

namespace crun::agent {

// This node's assignment in `doc`'s round (`place`: its ranks/ record), a spare's when it waits
// outside it, without the store's address (the round's group rank 0 serves it:
// HostsRoundStore); every member's address and ports where the document lists them
// (--contract). Nothing when `place` is another decision's: the decider has not taken this
// node's join yet, or a newer round is on its way.
std::optional<GroupAssignment> EtcdAssignment(const etcd::JobDoc& doc,
                                              const etcd::RankRecord& place, const RoundSelf& self);

// Whether `g`'s node serves the round's store: group rank 0 of the round, not a spare.
inline bool HostsRoundStore(const GroupAssignment& g) { return !g.spare && g.group_rank == 0; }

// The job's end as the document holds it (a root cause that cannot be read is logged and left
// out).
JobOutcome EtcdOutcome(const etcd::Outcome& o);
// This node's workers failed: its report/ record.
etcd::Report EtcdFailure(const report::FailureReport& failures);

}  // namespace crun::agent
