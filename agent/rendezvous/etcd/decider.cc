#include "agent/rendezvous/etcd/decider.h"

namespace crun::agent {

DecideResult DecideAndWrite(etcd::Client& client, const etcd::Keys& keys,
                            const etcd::Mirror& mirror, rdzv::TimePoint now,
                            etcd::Clock::time_point deadline, std::chrono::seconds retention) {
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
  std::vector<etcd::Op> ops;
  ops.push_back({etcd::Op::Kind::kPut, keys.state(), d.job_json, d.job_lease});
  ops.insert(ops.end(), d.ops.begin(), d.ops.end());
  const auto target = d.job_mod_revision == 0 ? etcd::Compare::Target::kCreateRevision
                                              : etcd::Compare::Target::kModRevision;
  auto txn = client.Txn({{keys.state(), target, d.job_mod_revision, ""}}, ops, {}, deadline);
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
