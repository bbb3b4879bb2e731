// The agent's gRPC client of the rendezvous service. Generated protobuf headers are included
// here and in session_wire.h (the agent's side of the wire; its failure reports go through the
// service's own conversions, rendezvous/service/proto_messages.h) and, outside the agent, by
// the gRPC service, the etcd client and the commands that speak to the service.
//
// SessionClient: an agent's end of the crun.v1 Session stream, on gRPC's callback API (no
// thread of its own). Messages from the service arrive through `on_message` on a gRPC thread,
// in order; `on_open` (when given) once the service has opened its end of the stream (its
// initial metadata came: the session was open, whatever it says later); `on_done` runs once
// when the stream ends, with why. Send never blocks.
//
// The session waits for the service to become reachable (wait_for_ready unless told not to; gRPC
// reconnects with its own backoff, never under 100 ms, growing to 1 s), so agents may start before
// the host that serves the endpoint; giving up is the caller's join timeout. (The agent first waits
// for the endpoint to accept TCP with a finer backoff of its own, service_rendezvous.cc, so that
// agents started together with the host node do not pay those 100 ms.) Keepalive pings notice a
// service that went silent (a cut link) within `keepalive_timeout`.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "base/security.h"
#include "base/status.h"
#include "base/write_queue.h"
#include "crun/v1/rendezvous.grpc.pb.h"
#include "proto/protocol_version.h"
#include "rendezvous/beats/beat_datagram.h"
#include "rendezvous/channel/channel.h"

namespace crun::agent {

namespace v1 = crun::v1;

using rdzv::ChannelOptions;
using rdzv::MakeChannel;

// What each call carries and how it waits.
struct CallOptions {
  std::string token;  // the job token; empty: none sent
  // Wait for the service to become reachable (gRPC retries) rather than fail at once.
  bool wait_for_ready = true;
};

class SessionClient final : public grpc::ClientBidiReactor<v1::AgentMessage, v1::ServiceMessage> {
 public:
  using MessageCallback = std::function<void(v1::ServiceMessage)>;
  using DoneCallback = std::function<void(const Status&)>;
  using OpenCallback = std::function<void()>;

  SessionClient(v1::Rendezvous::Stub& stub, MessageCallback on_message, DoneCallback on_done,
                const CallOptions& call = {}, OpenCallback on_open = nullptr);
  // Closes (see Close) and waits for the stream to end.
  ~SessionClient() override;

  void Send(v1::AgentMessage m);
  // Writes what is queued, then half-closes, and waits up to `grace` for the service to end
  // the stream before cancelling it. Returns once the stream has ended.
  void Close(std::chrono::milliseconds grace = std::chrono::milliseconds(500));
  // Ends the stream now, dropping what is queued.
  void Cancel() { context_.TryCancel(); }
  // Once open (on_open has run): the service's heartbeat ticket (rendezvous/beats), if it gave
  // one, and the address the stream reached ("ipv4:10.0.0.1:29400"). A ticket that does not
  // parse is none (`ticket_error` says why).
  std::optional<rdzv::BeatTicket> beat_ticket() const;
  std::string ticket_error() const;
  std::string peer() const;

  void OnReadInitialMetadataDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  void WaitDone();
  void ReleaseHold();

  grpc::ClientContext context_;
  v1::ServiceMessage in_;
  WriteQueue<v1::AgentMessage> writes_;
  MessageCallback on_message_;
  DoneCallback on_done_;
  OpenCallback on_open_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool closing_ = false;
  bool writes_done_started_ = false;
  std::optional<rdzv::BeatTicket> ticket_;  // under mu_, from the initial metadata
  std::string ticket_error_;
  std::string peer_;
  // Starting operations and releasing the hold exclude each other: after the release, only
  // reactions (OnWriteDone) start operations.
  std::mutex ops_mu_;
  bool hold_released_ = false;
};

}  // namespace crun::agent
