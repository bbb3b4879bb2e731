// A client of etcd's v3 API (gRPC, generated from etcd's own .proto files: CMakeLists.txt here)
// with what crun's etcd rendezvous needs and nothing more: reads, writes and transactions on
// keys, leases, and a watch on a prefix. Blocking calls, each bounded by a deadline; safe to
// call from several threads.
//
// * Several endpoints (the cluster's members): a call that fails because its member is down,
//   cut off or without a leader ("etcdserver: no leader") is retried on the next member until
//   the deadline. Reads are linearizable (etcd's default): a member without quorum cannot
//   answer them, so a minority member is never believed. A call that timed out is tried again
//   with twice the time (2 s, then up to 16 s). A write that timed out may have come through
//   all the same and be sent again, so every write the rendezvous makes is safe to repeat:
//   plain puts of a value that a second time leaves as it was (a join, a report, a round's
//   store address), or transactions whose compare fails on their own earlier success (a node
//   key's create revision, the job state's revision), after which the caller reads what is
//   there: its own node key, recognised by its lease (agent/rendezvous/etcd/node_lease.cc).
// * TLS (--tls-ca, --tls-cert, --tls-key, base/security.h) and etcd's user/password auth: the
//   token etcd hands out is sent with every call, and fetched again when etcd says it expired.
// * Errors name the endpoint(s) and say what to check.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/security.h"
#include "base/status.h"

namespace crun::etcd {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

struct ClientOptions {
  std::vector<std::string> endpoints;  // "host:port", IPv6 as "[::1]:2379"
  Security security;                   // TLS material (the token is not etcd's)
  std::string user;                    // etcd auth; empty: none
  std::string password;
  Millis keepalive_timeout{3'000};  // a member that stops answering pings is left after this
  // Connect reads a key to prove that a member with quorum answers; false: the caller's first
  // call proves it (one call fewer for each of a thousand agents), and words the error.
  bool probe = true;
  // The member tried first (an index into `endpoints`); the calls stay there until it fails.
  // Thousands of agents given the same list spread their connections over the members
  // instead of all landing on the first.
  std::size_t first_member = 0;
};

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  std::int64_t revision = 0;  // the store's revision the read saw
};

// One comparison of a transaction: the key's create or mod revision (0: the key does not
// exist) or its value, equal to what is given.
struct Compare {
  enum class Target { kCreateRevision, kModRevision, kValue };
  std::string key;
  Target target = Target::kModRevision;
  std::int64_t revision = 0;
  std::string value;
};

struct Op {
  enum class Kind { kPut, kDelete, kDeletePrefix, kGet, kGetPrefix };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;
  std::int64_t lease = 0;
  // A put that binds `lease` alone: etcd keeps the key's value (ignore_value), however large
  // or newer than the one read; the transaction fails if the key is gone.
  bool keep_value = false;
};

struct TxnResult {
  bool succeeded = false;
  std::int64_t revision = 0;
  std::vector<std::vector<KeyValue>> reads;  // one per kGet/kGetPrefix op of the branch taken
};

// The end of a prefix range: the prefix with its last byte incremented.
std::string PrefixEnd(const std::string& prefix);

struct WatchEvent {
  bool deleted = false;
  KeyValue kv;  // for a delete: the key and its mod_revision
};

class Client : public std::enable_shared_from_this<Client> {
 public:
  // Checks that a member answers (with auth, when given) before `deadline`, unless
  // options.probe is false; the error names every endpoint and the last failure.
  static StatusOr<std::shared_ptr<Client>> Connect(ClientOptions options,
                                                   Clock::time_point deadline);
  ~Client();

  StatusOr<RangeResult> Get(const std::string& key, Clock::time_point deadline);
  StatusOr<RangeResult> GetPrefix(const std::string& prefix, Clock::time_point deadline);
  // The revision of the write.
  StatusOr<std::int64_t> Put(const std::string& key, const std::string& value, std::int64_t lease,
                             Clock::time_point deadline);
  StatusOr<TxnResult> Txn(const std::vector<Compare>& compares, const std::vector<Op>& then,
                          const std::vector<Op>& otherwise, Clock::time_point deadline);
  // A lease of `ttl`; its id.
  StatusOr<std::int64_t> Grant(std::chrono::seconds ttl, Clock::time_point deadline);
  // The lease's remaining TTL after refreshing it; NotFound when it has expired.
  StatusOr<std::int64_t> KeepAliveOnce(std::int64_t lease, Clock::time_point deadline);
  Status Revoke(std::int64_t lease, Clock::time_point deadline);

  // "h1:2379,h2:2379", for messages.
  std::string endpoints() const;
  // The member the calls go to now: an index into the endpoints.
  std::size_t member() const;

  // Watches every key under `prefix` from `start_revision` on, on a thread of its own:
  // `on_events` gets each batch in revision order with the revision it brings the view to.
  // A member that fails or loses its leader is left for the next one, and the watch resumes
  // where it was. `on_error` once, and nothing after, when it cannot go on: the revisions it
  // needs were compacted (read the prefix again and watch anew) or no member answered for
  // `give_up_after`. Destroying the handle stops it (no callback runs after).
  class Watch {
   public:
    virtual ~Watch() = default;
  };
  std::unique_ptr<Watch> WatchPrefix(
      const std::string& prefix, std::int64_t start_revision,
      std::function<void(std::vector<WatchEvent>, std::int64_t revision)> on_events,
      std::function<void(Status)> on_error, Millis give_up_after);

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crun::etcd
