#include "agent/rendezvous/etcd/decider.h"

#include <algorithm>

namespace crun::agent {

DecideResult DecideAndWrite(etcd::Client& client, const etcd::Keys& keys,
                            const etcd::Mirror& mirror, const std::string& self,
                            rdzv::TimePoint now, etcd::Clock::time_point deadline,
                            std::chrono::seconds retention) {
  DecideResult r;
  const auto wall = etcd::WallClock::now();
  auto d = etcd::Decide(keys, mirror, now, wall, {retention, 0});
  if (d.needs_lease) {
    auto lease = client.Grant(retention, deadline);
    if (!lease.ok()) {
      r.unanswered = lease.status();
      r.wake_at = now + std::chrono::milliseconds(500);
      return r;
    }
    d = etcd::Decide(keys, mirror, now, wall, {retention, *lease});
  }
  r.wake_at = d.wake_at;
  if (!d.error.ok()) {
    r.error = d.error;
    return r;
  }
  if (!d.write) return r;
  const auto target = d.job_mod_revision == 0 ? etcd::Compare::Target::kCreateRevision
                                              : etcd::Compare::Target::kModRevision;
  const etcd::Compare unchanged{keys.state(), target, d.job_mod_revision, ""};
  // Each node's place first, while this node still decides and the state is as it was read:
  // a decider that lost its place or its race writes none (and the token tells its records
  // from the round announced).
  for (std::size_t at = 0; at < d.rank_ops.size(); at += etcd::kMaxTxnOps - 1) {
    const auto end =
        d.rank_ops.begin() +
        static_cast<std::ptrdiff_t>(std::min(d.rank_ops.size(), at + etcd::kMaxTxnOps - 1));
    std::vector<etcd::Op> batch(d.rank_ops.begin() + static_cast<std::ptrdiff_t>(at), end);
    auto txn = client.Txn({unchanged, {keys.decider(), etcd::Compare::Target::kValue, 0, self}},
                          batch, {}, deadline);
    if (!txn.ok()) {
      r.unanswered = txn.status();
      r.wake_at = now + std::chrono::milliseconds(500);
      return r;
    }
    if (!txn->succeeded) return r;  // lost: what it lost to is on its way
  }
  std::vector<etcd::Op> ops;
  ops.push_back({etcd::Op::Kind::kPut, keys.state(), d.job_json, d.job_lease});
  ops.insert(ops.end(), d.ops.begin(), d.ops.end());
  auto txn = client.Txn({unchanged}, ops, {}, deadline);
  if (!txn.ok()) {
    r.unanswered = txn.status();
    r.wake_at = now + std::chrono::milliseconds(500);
  } else if (txn->succeeded) {
    // Its writes are under the prefix, so the watch reaches exactly this revision. (A lost
    // race needs no such wait: the newer document it lost to is on its way.)
    r.written_revision = txn->revision;
    r.log = std::move(d.log);
  }
  return r;
}

}  // namespace crun::agent
