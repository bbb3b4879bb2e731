// A round's worker store, as every rendezvous hosts one: the static rendezvous on node 0 (or
// Slurm task 0, or the one node), crun's service for each round of its jobs, and under etcd the
// crun of the round's group rank 0. The one place that says how such a store is set up (where
// it binds, how many connections it expects, whom it admits) and when it is replaced: a fresh
// store each round, so that a restarted worker never reads a key of an earlier attempt, or one
// for the whole job where the port is fixed (torchrun's static backend).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "base/status.h"
#include "rendezvous/store_server/store_server.h"

namespace crun {

struct RoundStoreSpec {
  std::string bind_host = "::";  // "::": every interface
  std::uint16_t port = 0;        // 0: a free one
  int world_size = 0;            // the round's workers: the connections to expect (0: unknown)
  // Each member's IP addresses, when the rendezvous knows them: only those may connect
  // (RoundAllowList). Empty: not known (the static backend's nodes), so anyone may.
  std::vector<std::vector<std::string>> members;
  // The store's host runs workers of the round (a node's crun, not the service), which may
  // come over loopback: loopback is admitted too.
  bool host_runs_workers = true;
  std::size_t max_connections_per_peer = 0;  // 0: no such bound
};

// The store server's options for `spec`.
StoreServerOptions RoundStoreOptions(const RoundStoreSpec& spec);

// Serves one round's store at a time, on the caller's event loop or on a thread of its own.
class RoundStoreHost {
 public:
  // `io`: serve on that loop (call Serve and Stop on its thread); null: on a thread of its own.
  explicit RoundStoreHost(boost::asio::io_context* io = nullptr) : io_(io) {}
  ~RoundStoreHost() { Stop(); }
  RoundStoreHost(const RoundStoreHost&) = delete;
  RoundStoreHost& operator=(const RoundStoreHost&) = delete;

  // Round `round`'s store: the one served already when it is that round's, else a new one in
  // place of the last. A store for the whole job: the same `round` every time. The error says
  // why the store could not start.
  StatusOr<std::uint16_t> Serve(int round, const RoundStoreSpec& spec);
  void Stop();
  bool serving() const { return on_loop_ != nullptr || own_thread_ != nullptr; }
  std::uint16_t port() const;           // 0 when not serving
  int round() const { return round_; }  // -1 when not serving

 private:
  boost::asio::io_context* io_;
  std::unique_ptr<StoreServer> on_loop_;
  std::unique_ptr<BackgroundStoreServer> own_thread_;
  int round_ = -1;
};

}  // namespace crun
