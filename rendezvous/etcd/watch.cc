// Client::WatchPrefix (client.h): one stream at a time on the calls' member, resumed from the
// next revision on another when it fails, is left, or loses its leader.
#include "rendezvous/etcd/client_impl.h"

namespace crun::etcd {

namespace {

class PrefixWatch final : public Client::Watch, Client::Impl::MemberUser {
 public:
  PrefixWatch(std::shared_ptr<Client> client, Client::Impl* impl, std::string prefix,
              std::int64_t start,
              std::function<void(std::vector<WatchEvent>, std::int64_t)> on_events,
              std::function<void(Status)> on_error, Millis give_up_after)
      : client_(std::move(client)),
        impl_(impl),
        prefix_(std::move(prefix)),
        next_(start),
        on_events_(std::move(on_events)),
        on_error_(std::move(on_error)),
        give_up_after_(give_up_after),
        thread_([this] { Run(); }) {
    impl_->AddUser(this);
  }

  ~PrefixWatch() override {
    impl_->RemoveUser(this);
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
      if (ctx_) ctx_->TryCancel();
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Left(std::size_t member) override {
    std::lock_guard lock(mu_);
    if (ctx_ != nullptr && member_ == member) ctx_->TryCancel();
  }

  // One stream after another, each on the current member, until the watch is stopped, etcd
  // compacted the revisions it needs, or no member answered for give_up_after_.
  void Run() {
    auto last_ok = Clock::now();
    Millis pause{20};
    while (true) {
      const std::size_t m = impl_->current.load();
      // A member that does not connect within an attempt's time is left for the next.
      const bool connected =
          impl_->channels[m]->WaitForConnected(SystemDeadline(Clock::now() + kAttempt));
      auto ctx = NewContext();
      if (!Attach(ctx.get(), m)) return;
      const StreamEnd end = Stream(*ctx, m, connected, last_ok, pause);
      if (!Detach()) return;
      if (end.compacted) {
        return on_error_(NotFound("etcd compacted the revisions this watch of " + prefix_ +
                                  " needs (from " + std::to_string(next_) + ")"));
      }
      const std::string last_error =
          "etcd at " + impl_->o.endpoints[m] + ": " +
          (end.cancel_reason.empty() ? end.status.error_message() : end.cancel_reason);
      if (TokenExpired(end.status) || end.cancel_reason.find("auth") != std::string::npos) {
        std::lock_guard token(impl_->token_mu);
        impl_->token.clear();  // fetched again before the next stream
      }
      impl_->Rotate(m);
      if (Clock::now() - last_ok > give_up_after_) {
        return on_error_(Unavailable(
            "lost the watch on etcd at " + impl_->Endpoints() + ": no member answered for " +
            std::to_string(give_up_after_.count()) + " ms (last: " + last_error + ")"));
      }
      if (!Pause(pause)) return;
    }
  }

  // How a stream ended.
  struct StreamEnd {
    bool compacted = false;
    std::string cancel_reason;  // etcd canceled the watch
    grpc::Status status;
  };

  std::unique_ptr<grpc::ClientContext> NewContext() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("hasleader", "true");
    std::lock_guard token(impl_->token_mu);
    if (!impl_->token.empty()) ctx->AddMetadata("token", impl_->token);
    return ctx;
  }

  // The stream's context, for the destructor and Left() to cancel; false once stopped.
  bool Attach(grpc::ClientContext* ctx, std::size_t member) {
    std::lock_guard lock(mu_);
    if (stopped_) return false;
    ctx_ = ctx;
    member_ = member;
    return true;
  }
  bool Detach() {
    std::lock_guard lock(mu_);
    ctx_ = nullptr;
    return !stopped_;
  }

  // Watches from next_ on member `m` and hands on its events until the stream ends; each
  // answer resets `last_ok` and `pause`.
  StreamEnd Stream(grpc::ClientContext& ctx, std::size_t m, bool connected,
                   Clock::time_point& last_ok, Millis& pause) {
    StreamEnd end;
    auto stream = impl_->watch[m]->Watch(&ctx);
    if (!connected) ctx.TryCancel();
    etcdserverpb::WatchRequest req;
    auto* create = req.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(PrefixEnd(prefix_));
    create->set_start_revision(next_);
    if (stream->Write(req)) {
      etcdserverpb::WatchResponse resp;
      while (stream->Read(&resp)) {
        if (resp.compact_revision() > 0) {
          end.compacted = true;
          break;
        }
        if (resp.canceled()) {
          end.cancel_reason = resp.cancel_reason();
          break;
        }
        last_ok = Clock::now();
        pause = Millis(20);
        Deliver(resp);
      }
    }
    ctx.TryCancel();
    end.status = stream->Finish();
    return end;
  }

  void Deliver(const etcdserverpb::WatchResponse& resp) {
    if (resp.events().empty()) return;
    std::vector<WatchEvent> events;
    std::int64_t revision = next_ - 1;
    for (const auto& e : resp.events()) {
      WatchEvent w;
      w.deleted = e.type() == mvccpb::Event::DELETE;
      w.kv = FromPb(e.kv());
      revision = std::max(revision, e.kv().mod_revision());
      events.push_back(std::move(w));
    }
    next_ = revision + 1;
    on_events_(std::move(events), revision);
  }

  // Waits `pause` (doubling it, up to 0.5 s) unless stopped, then fetches a token for the
  // next stream when the last one lost it; false once stopped.
  bool Pause(Millis& pause) {
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, pause, [this] { return stopped_; });
      pause = std::min(pause * 2, Millis(500));
      if (stopped_) return false;
    }
    if (impl_->o.user.empty()) return true;
    bool empty = false;
    {
      std::lock_guard token(impl_->token_mu);
      empty = impl_->token.empty();
    }
    // A failed read is retried by Call itself.
    if (empty) (void)impl_->Authenticate(impl_->current.load(), Clock::now() + kAttempt);
    return true;
  }

  std::shared_ptr<Client> client_;  // keeps the channels alive
  Client::Impl* impl_;
  std::string prefix_;
  std::int64_t next_;
  std::function<void(std::vector<WatchEvent>, std::int64_t)> on_events_;
  std::function<void(Status)> on_error_;
  Millis give_up_after_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  grpc::ClientContext* ctx_ = nullptr;
  std::size_t member_ = 0;  // of ctx_'s stream
  std::thread thread_;      // last: starts once everything above is set
};

}  // namespace

std::unique_ptr<Client::Watch> Client::WatchPrefix(
    const std::string& prefix, std::int64_t start_revision,
    std::function<void(std::vector<WatchEvent>, std::int64_t)> on_events,
    std::function<void(Status)> on_error, Millis give_up_after) {
  return std::make_unique<PrefixWatch>(shared_from_this(), impl_.get(), prefix, start_revision,
                                       std::move(on_events), std::move(on_error), give_up_after);
}

}  // namespace crun::etcd
