// Snapshots replicated to a peer node (docs/checkpoints.md, "On a peer"): each node sends every
// snapshot its workers save to the next node of the round (group rank + 1, a ring), which keeps
// the two newest copies of each rank. A node that takes over a lost node's ranks (a spare, or
// a crun started again in its place) finds them there and loads them instead of going to
// disk.
//
// Nodes find each other through the round's store: each publishes "crun/replica/<group rank>"
// = "address:port" of its replica server when its workers start. Peers talk plain TCP, one
// line per request (over TLS when the job has TLS: agent/snapshots/peer_link.h), with the
// job's token proven on each connection: the server sends a nonce, the client answers with
// HMAC-SHA256(token, nonce + the TLS session's binding), and a connection without it is
// refused (and logged). With no token, any peer that reaches the port is answered.
//   put BYTES + BYTES     a sealed snapshot (header and payload, checksum included)
//                         -> "ok", or "error WHY" (a copy that fails its checksum is dropped)
//   steps R W             -> "ok S1,S2" the steps of rank R that a world of W may load
//   get R S               -> "ok BYTES" + BYTES, or "error WHY"
// A copy being received goes into memory of its own and replaces the older of the two only
// once it is whole and checked, so a sender killed mid-copy leaves the previous copies whole.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/snapshots/peer_link.h"
#include "base/socket.h"
#include "base/status.h"

namespace crun::agent {

class NodeSnapshots;

struct ReplicaCounters {
  std::uint64_t sent = 0, sent_bytes = 0, send_failures = 0;
  std::uint64_t received = 0, refused = 0, fetched = 0;
  std::uint64_t held_bytes = 0;  // the copies this node holds for others
};

// What proves the job's token to a replica server: HMAC-SHA256(token, challenge) in hex, the
// challenge being the server's nonce followed by the TLS session's binding (PeerLink::Binding,
// empty on plain TCP); "-" without a token.
std::string ReplicaProof(const std::string& token, const std::string& challenge);

class Replicas {
 public:
  // Listens on every address of the node, on a port the kernel picks. `token`: the job's
  // (empty: none).
  // `tls`: the job's TLS for copies (null: plain TCP).
  static StatusOr<std::unique_ptr<Replicas>> Listen(std::string token,
                                                    std::shared_ptr<PeerTls> tls = nullptr);
  ~Replicas();
  Replicas(const Replicas&) = delete;
  Replicas& operator=(const Replicas&) = delete;

  std::uint16_t port() const { return port_; }

  // A new round: this node's group rank among `nodes`, and the round's store. Publishes this
  // node's address there and looks the next node's up, on a thread of its own; until then,
  // and in a round of one node, nothing is sent.
  void NewRound(int group_rank, int nodes, const std::string& store_host, std::uint16_t store_port);
  // Whether this round replicates (more than one node).
  bool active() const { return nodes_.load() > 1; }

  // Sends one sealed snapshot (its 4 KiB header, then `payload_bytes` of payload) of local rank
  // `local_rank` to the next node and waits for its answer. On the rank's sealer thread.
  Status Send(int local_rank, const unsigned char* header, const unsigned char* payload,
              std::uint64_t payload_bytes);

  // The steps of `rank`'s snapshots that the other nodes of the round hold and a world of
  // `world_size` may load, newest first; remembers who holds each, for Fetch.
  std::vector<std::uint64_t> PeerSteps(std::int64_t rank, std::int64_t world_size);
  // `rank`'s snapshot at `step` from the node that holds it (PeerSteps found it), read
  // straight into local rank `local_rank`'s buffer in `memory` and checked against its
  // checksum (NodeSnapshots::Fill); `from` says which node. Returns the buffer's index.
  StatusOr<int> Fetch(std::int64_t rank, std::uint64_t step, NodeSnapshots& memory, int local_rank,
                      std::string* from);

  ReplicaCounters counters() const;

 private:
  struct Copy {
    std::uint64_t step = 0;
    std::int64_t world_size = 0;
    std::uint32_t layout = 0;
    // Shared, so that a copy is sent to a peer that asks for it without a second copy.
    std::shared_ptr<const std::vector<unsigned char>> bytes;
  };
  struct Background {  // a thread of this object's, and whether it has finished
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  struct Link {  // a connection to a peer, with its endpoint
    std::string endpoint;
    PeerLink conn;
  };

  Replicas(UniqueFd listener, std::uint16_t port, std::string token, std::shared_ptr<PeerTls> tls);
  static void Reap(std::vector<Background>& threads);  // joins those that have finished
  void AcceptLoop();
  void Serve(int fd, std::string peer);
  Status Put(PeerLink& link, std::uint64_t n, std::string_view peer, bool* consumed);
  void Discover(int round, int group_rank, int nodes, std::string store_host,
                std::uint16_t store_port);
  void Lookup(int round, int group_rank, int nodes, const std::string& store_host,
              std::uint16_t store_port);
  StatusOr<PeerLink> Dial(const std::string& endpoint);
  std::vector<std::string> Endpoints();  // the other nodes', from the round's store

  UniqueFd listener_;
  std::uint16_t port_ = 0;
  std::string token_;
  std::shared_ptr<PeerTls> tls_;
  int wake_[2] = {-1, -1};  // the accept loop's stop signal
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;
  std::map<std::int64_t, std::deque<Copy>> copies_;  // by rank, newest last, two at most
  std::vector<Background> sessions_;                 // one a connection
  std::vector<int> session_fds_;
  ReplicaCounters counters_;
  // The round.
  std::atomic<int> nodes_{1};
  int group_rank_ = 0;
  std::string store_host_;
  std::uint16_t store_port_ = 0;
  std::string next_;      // the next node's endpoint; empty: not known (yet)
  bool looking_ = false;  // this round's lookup still runs
  std::condition_variable found_;
  std::atomic<int> round_{0};
  std::vector<Background> discoveries_;  // the rounds' lookups not joined yet; the agent's loop
  std::map<int, Link> links_;            // by local rank
  std::map<std::pair<std::int64_t, std::uint64_t>, std::string> where_;  // (rank, step) -> peer
};

}  // namespace crun::agent
