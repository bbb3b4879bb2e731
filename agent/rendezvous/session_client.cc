#include "agent/rendezvous/session_client.h"

#include "base/security.h"

namespace crun::agent {

SessionClient::SessionClient(v1::Rendezvous::Stub& stub, MessageCallback on_message,
                             DoneCallback on_done, const CallOptions& call, OpenCallback on_open)
    : on_message_(std::move(on_message)),
      on_done_(std::move(on_done)),
      on_open_(std::move(on_open)) {
  context_.set_wait_for_ready(call.wait_for_ready);
  if (!call.token.empty()) context_.AddMetadata(crun::kTokenHeader, call.token);
  stub.async()->Session(&context_, this);
  // The hold keeps OnDone away while this side may still start operations (Send, Close from
  // other threads): starting one after OnDone has begun is undefined. It goes when the stream
  // ends (OnReadDone(false)) or Close() is done with it.
  AddHold();
  StartRead(&in_);
  StartCall();
}

SessionClient::~SessionClient() { Close(); }

void SessionClient::Send(v1::AgentMessage m) {
  std::lock_guard lock(ops_mu_);
  if (hold_released_) return;  // the stream is over (or closing): nothing more goes out
  if (const auto* next = writes_.Push(std::move(m))) StartWrite(next);
}

void SessionClient::ReleaseHold() {
  std::lock_guard lock(ops_mu_);
  if (hold_released_) return;
  hold_released_ = true;
  RemoveHold();
}

void SessionClient::OnReadInitialMetadataDone(bool ok) {
  if (!ok) return;
  {
    std::lock_guard lock(mu_);
    peer_ = context_.peer();
    const auto& md = context_.GetServerInitialMetadata();
    if (const auto it = md.find(rdzv::kBeatTicketHeader); it != md.end()) {
      auto t = rdzv::ParseBeatTicket(std::string_view(it->second.data(), it->second.size()));
      if (t.ok()) {
        ticket_ = *t;
      } else {
        ticket_error_ = t.status().message();
      }
    }
  }
  if (on_open_) on_open_();
}

std::optional<rdzv::BeatTicket> SessionClient::beat_ticket() const {
  std::lock_guard lock(mu_);
  return ticket_;
}

std::string SessionClient::ticket_error() const {
  std::lock_guard lock(mu_);
  return ticket_error_;
}

std::string SessionClient::peer() const {
  std::lock_guard lock(mu_);
  return peer_;
}

void SessionClient::OnReadDone(bool ok) {
  if (!ok) return ReleaseHold();  // the stream is ending: OnDone follows
  on_message_(std::move(in_));
  in_.Clear();
  StartRead(&in_);
}

void SessionClient::OnWriteDone(bool ok) {
  if (!ok) writes_.Close();
  if (const auto* next = writes_.Done()) {
    StartWrite(next);
    return;
  }
  std::unique_lock lock(mu_);
  if (closing_ && ok && !writes_done_started_) {
    writes_done_started_ = true;
    lock.unlock();
    StartWritesDone();
  }
}

void SessionClient::OnWritesDoneDone(bool) {}

void SessionClient::OnDone(const grpc::Status& status) {
  writes_.Close();
  Status s = Status::Ok();
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
      status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    s = PermissionDenied(status.error_message());
  } else if (!status.ok()) {
    s = Unavailable(status.error_message() + " (gRPC code " +
                    std::to_string(static_cast<int>(status.error_code())) + ")");
  }
  on_done_(s);
  std::lock_guard lock(mu_);
  done_ = true;
  cv_.notify_all();
}

void SessionClient::Close(std::chrono::milliseconds grace) {
  {
    std::lock_guard ops(ops_mu_);
    if (!hold_released_) {  // the stream is live: half-close it once the queue is written
      bool start_writes_done = false;
      {
        std::lock_guard lock(mu_);
        if (!closing_) {
          closing_ = true;
          if (writes_.Close(/*drain=*/true)) {
            writes_done_started_ = true;
            start_writes_done = true;
          }
        }
      }
      if (start_writes_done) StartWritesDone();
      hold_released_ = true;
      RemoveHold();
    }
  }
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, grace, [this] { return done_; })) {
    lock.unlock();
    context_.TryCancel();
    lock.lock();
    cv_.wait(lock, [this] { return done_; });
  }
}

}  // namespace crun::agent
