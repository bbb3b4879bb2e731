// The etcd rendezvous's election role: one agent of a run decides for it, the one holding
// a/decider, a key bound to its lease. When that lease ends (its node lost or gone) the key goes
// with it, and the agents that see no decider stand again; the first transaction wins.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/job.h"

namespace crun::agent {

// Stands as the run's decider: writes a/decider = `node_id`, bound to `lease`, unless some
// agent holds it. OK whether or not it won (the watch brings the winner); kNotFound when etcd no
// longer knows the lease; another error when etcd did not answer.
Status StandAsDecider(etcd::Client& client, const etcd::Keys& keys, const std::string& node_id,
                      std::int64_t lease, etcd::Clock::time_point deadline);

}  // namespace crun::agent
