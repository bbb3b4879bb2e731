#include "agent/rendezvous/etcd/election.h"

namespace crun::agent {

Status StandAsDecider(etcd::Client& client, const etcd::Keys& keys, const std::string& node_id,
                      std::int64_t lease, etcd::Clock::time_point deadline) {
  return client
      .Txn({{keys.decider(), etcd::Compare::Target::kCreateRevision, 0, ""}},
           {{etcd::Op::Kind::kPut, keys.decider(), node_id, lease}}, {}, deadline)
      .status();
}

}  // namespace crun::agent
