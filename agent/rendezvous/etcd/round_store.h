// The etcd rendezvous's store role: the crun of a round's group rank 0 serves the round's store
// (rendezvous/store_server/round_store.h: admitting the members' addresses from their node
// records) and publishes where it is as stores/<round>, bound to its lease, so that the store's
// key goes when its host does; the other members read it there.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/job.h"
#include "rendezvous/store_server/round_store.h"

namespace crun::agent {

class EtcdRoundStore {
 public:
  // `advertise`: the address other nodes reach this one on (MASTER_ADDR of the round).
  EtcdRoundStore(std::shared_ptr<etcd::Client> client, etcd::Keys keys, std::string advertise)
      : client_(std::move(client)), keys_(std::move(keys)), advertise_(std::move(advertise)) {}

  // Serves the store of `round` (its history: rounds/<round>), unless it does already, and
  // publishes it bound to `lease`: "host:port". `records`: the members' node records
  // (nodes/<id>), as read from etcd. The error names the round and what failed.
  StatusOr<std::string> Serve(const etcd::RoundHistory& round, const etcd::Mirror& records,
                              std::int64_t lease, etcd::Clock::time_point deadline);
  // The same for round `round`, its history and the members' records read from
  // `decider_mirror` (the decider's mirror holds them) or, when null, from etcd in one
  // transaction. The error names the key or the round and what failed.
  StatusOr<std::string> ServeRound(int round, const etcd::Mirror* decider_mirror,
                                   std::int64_t lease, etcd::Clock::time_point deadline);
  void Stop() { host_.Stop(); }
  bool serving(int round) const { return host_.serving() && host_.round() == round; }

 private:
  std::shared_ptr<etcd::Client> client_;
  etcd::Keys keys_;
  std::string advertise_;
  RoundStoreHost host_;  // on a thread of its own: the etcd thread blocks on etcd
  std::string published_;
};

}  // namespace crun::agent
