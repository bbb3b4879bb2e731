// StoreServer: the c10d-compatible TCP store (docs/store_protocol.md) on Boost.Asio.
//
// * One event loop: the server runs on the io_context it is given and never blocks it; all its
//   handlers run there. Several servers may share one io_context (one per rendezvous round).
// * Each connection's dialect (PyTorch 1.13 or 2.x) is detected from its first bytes.
// * Waits are registered server-side and answered exactly once; nothing polls.
// * A connection that breaks the protocol or a limit is logged with its peer address and
//   closed; the server and every other connection carry on. Past `max_connections`, or at the
//   process's descriptor limit, new connections are accepted and closed at once (refused
//   cleanly), and counted. Peer addresses are only ever formatted numerically: the server
//   never waits on DNS.
//
// Start() and Stop() must run on the io_context's thread (or before it runs);
// BackgroundStoreServer wraps a server with its own thread for embedding and tests.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "base/status.h"
#include "rendezvous/store/limits.h"
#include "rendezvous/store/wire.h"

namespace crun {

struct StoreServerOptions {
  // Address to bind: an IP literal or a host name. "::" (the default) listens on every
  // interface, IPv4 included (dual-stack); "0.0.0.0" on every IPv4 interface only.
  std::string host = "::";
  std::uint16_t port = 0;  // 0: any free port (read it back with port())
  StoreLimits limits;
  // 0: as many as the descriptor limit allows. At the limit, accept() fails and the server
  // refuses the connection through a descriptor it keeps spare for exactly that.
  std::size_t max_connections = 0;
  // 0: the system maximum (net.core.somaxconn).
  int backlog = 0;
  // Listening sockets on the port (SO_REUSEPORT), each with its own accept queue of `backlog`:
  // enough that their queues hold every connection a storm may bring at once (at most 16).
  // A storm into one full queue has its surplus dropped by the kernel and retried by the
  // clients a second later. The connections to expect: the job's workers, when the caller
  // knows them; 0: max_connections, else the descriptor limit.
  std::size_t expected_connections = 0;
  // At most this many connections open from one IP address at a time (0: no such bound).
  std::size_t max_connections_per_peer = 0;
  // When not empty, only these IP addresses (literals; an IPv4 client of a dual-stack socket
  // counts as its IPv4 address) may connect: the others are closed on accept, counted and
  // logged with their address. The rendezvous service lists a round's nodes here.
  std::vector<std::string> allowed_peers;

  Status Validate() const;
};

struct StoreServerStats {
  std::uint64_t open_connections = 0;
  std::uint64_t accepted = 0;
  std::uint64_t refused = 0;            // over max_connections or at the descriptor limit
  std::uint64_t refused_per_peer = 0;   // over max_connections_per_peer
  std::uint64_t refused_strangers = 0;  // from an address not in allowed_peers
  std::uint64_t protocol_errors = 0;    // connections closed for a malformed or oversize request
  std::uint64_t requests = 0;
  std::array<std::uint64_t, wire::kCommandCount> requests_by_command{};  // by wire::Command
  std::uint64_t pending_waits = 0;  // WAITs and BARRIERs not answered yet
  std::uint64_t stored_bytes = 0;   // keys plus values held
  std::uint64_t read_pauses = 0;    // times a client's unread replies stopped its reads
};

class StoreServer {
 public:
  static StatusOr<std::unique_ptr<StoreServer>> Start(boost::asio::io_context& io,
                                                      const StoreServerOptions& options);
  virtual ~StoreServer() = default;

  // Closes the listening socket and every connection. Idempotent.
  virtual void Stop() = 0;
  virtual std::uint16_t port() const = 0;
  // "127.0.0.1:29500" / "[::]:29500"
  virtual std::string endpoint() const = 0;
  // Call on the io_context's thread (BackgroundStoreServer::stats() does that for you).
  virtual StoreServerStats stats() const = 0;
  // 0 when only the descriptor limit bounds the connections.
  virtual std::size_t max_connections() const = 0;
};

// A StoreServer on its own io_context and thread. Destruction stops and joins it.
class BackgroundStoreServer {
 public:
  static StatusOr<std::unique_ptr<BackgroundStoreServer>> Start(const StoreServerOptions& options);
  ~BackgroundStoreServer();

  std::uint16_t port() const { return port_; }
  std::string endpoint() const { return endpoint_; }
  // Runs on the server's thread and waits for the answer.
  StoreServerStats stats();

 private:
  BackgroundStoreServer() = default;

  boost::asio::io_context io_;
  std::unique_ptr<StoreServer> server_;
  std::thread thread_;
  std::uint16_t port_ = 0;
  std::string endpoint_;
};

// "3 open, 10 accepted, 1 refused at a limit, 0 refused per address, 2 refused strangers, ..."
std::string FormatStats(const StoreServerStats& s);

// Raises this process's soft descriptor limit to the hard limit; returns the new soft limit.
std::uint64_t RaiseDescriptorLimit();

}  // namespace crun
