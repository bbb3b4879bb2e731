// The etcd rendezvous's lease role: this node's membership of the run. A lease whose TTL is the
// job's heartbeat_timeout and, bound to it, nodes/<node id> holding the node's record; when the
// node is cut off from etcd for longer than the TTL, etcd deletes both, which is how the other
// nodes learn it is lost. Everything else the node writes for the job (its join, the round's
// store, the decider's key) is bound to the same lease.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/rendezvous/etcd_rendezvous.h"
#include "base/status.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/job.h"

namespace crun::agent {

// Whether a registration's transaction that found the node key already there found this very
// registration's earlier try: the key is bound to `lease`, the lease the try wrote it with (a
// try whose answer was lost to a timeout, and which the client sent again). `failed` is the
// transaction's answer, its read of the key.
bool RegisteredEarlier(const etcd::TxnResult& failed, std::int64_t lease);

// How this node reaches etcd, what its record says, and its lease's TTL (heartbeat_timeout,
// whole seconds, at least 1), from its options.
etcd::ClientOptions ClientOptionsOf(const EtcdRendezvousOptions& o);
etcd::NodeRecord NodeRecordOf(const EtcdRendezvousOptions& o);
std::chrono::seconds LeaseTtl(const EtcdRendezvousOptions& o);

class EtcdNodeLease {
 public:
  EtcdNodeLease(std::shared_ptr<etcd::Client> client, etcd::Keys keys, std::string run_id,
                etcd::NodeRecord record, std::chrono::seconds ttl);

  // A fresh lease and this node's key bound to it (any refusal of an earlier try removed). A
  // key of the same node id still held by an earlier agent (a crun restarted on this node
  // before its lease ran out) is looked at again until `wait_until`; then the error names the
  // node id, the run and the key. `deadline` gives each call's deadline. `with`: puts to make
  // in the same transaction, bound to the new lease (the node's join: one write, not two).
  Status Register(const std::function<etcd::Clock::time_point()>& deadline,
                  etcd::Clock::time_point wait_until, const std::vector<etcd::Op>& with = {});

  enum class Beat {
    kAlive,       // etcd refreshed the lease
    kLost,        // etcd no longer knows it: it ran out, and the node's key went with it
    kUnanswered,  // etcd did not answer (an outage): `why`
  };
  Beat KeepAlive(etcd::Clock::time_point deadline, Status* why);

  // Ends the lease now: etcd deletes every key bound to it.
  Status Revoke(etcd::Clock::time_point deadline);

  std::int64_t id() const { return id_; }                        // 0 before Register
  std::int64_t node_revision() const { return node_revision_; }  // when the key was created
  // How often to keep it alive: a third of the TTL, at least 300 ms.
  std::chrono::milliseconds interval() const;

 private:
  std::shared_ptr<etcd::Client> client_;
  etcd::Keys keys_;
  std::string run_id_;
  etcd::NodeRecord record_;
  std::chrono::seconds ttl_;
  std::int64_t id_ = 0;
  std::int64_t node_revision_ = 0;
};

}  // namespace crun::agent
