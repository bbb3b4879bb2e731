// The rendezvous service over gRPC (proto/crun/v1/rendezvous.proto): the engine (engine.h) on
// a thread and event loop of its own, behind gRPC's callback API (no thread per session, so
// one daemon holds thousands of agents). The standard grpc.health.v1 service runs beside it.
//
// Each agent's Session stream feeds the engine in order; the engine's messages are queued on
// the stream without blocking. A stream that ends or breaks is a lost node at once. Each
// round's worker store (a crun StoreServer) listens on the service's host, on a free port.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/security.h"
#include "base/status.h"
#include "http/http_server.h"

namespace crun::rdzv {

struct ServiceOptions {
  // gRPC listens here; the rounds' worker stores bind the same host.
  std::string host = "0.0.0.0";
  std::uint16_t port = 29400;  // 0: a free port (read it back with port())
  // MASTER_ADDR given to every agent; empty: the host each agent dialed.
  std::string advertise_addr;
  std::size_t keep_finished_jobs = 64;
  // A daemon that outlives its jobs: agents that lose it reconnect instead of failing.
  bool durable = false;
  bool log_decisions = true;  // one spdlog line per round, stop, refusal, outcome
  // Job token (every call must carry it when set) and TLS (security.h).
  Security security;
  // Each round's worker store accepts only its nodes' addresses (security.h, docs/security.md).
  bool store_allow_list = true;
  // Connections one address may hold open on a round's store (0: no bound).
  std::size_t store_connections_per_peer = 4096;
  // Prometheus metrics at /metrics (docs/observability.md), served on the engine's thread;
  // TLS with the service's certificate when the service has one.
  std::optional<http::HttpServerOptions> metrics;
  // Heartbeats over UDP on the same address and port (rendezvous/beats/beat_datagram.h): each
  // session gets a ticket; an agent beats on its stream until the service hears a datagram.
  // Off, or UDP not bindable there (said in a warning): every beat comes on the stream.
  bool udp_heartbeats = true;
};

struct ServiceStats {
  std::uint64_t sessions = 0;  // bound to a job
  std::uint64_t jobs = 0;
  std::uint64_t refused_calls = 0;  // without the job token, or with a wrong one
};

class RendezvousService {
 public:
  // Listening when this returns; an error names host:port ("address already in use").
  static StatusOr<std::unique_ptr<RendezvousService>> Start(const ServiceOptions& options);
  virtual ~RendezvousService() = default;
  virtual std::uint16_t port() const = 0;
  // "http://127.0.0.1:9400/metrics" (https with TLS), or "" without options.metrics.
  virtual std::string metrics_url() const = 0;
  // Waits up to `grace` for the agents to end their sessions (they do on a job's outcome),
  // then ends the rest, closes the stores and joins the thread. Idempotent.
  virtual void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(200)) = 0;
  virtual ServiceStats stats() = 0;
};

}  // namespace crun::rdzv
