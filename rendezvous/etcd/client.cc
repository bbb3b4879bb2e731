#include "rendezvous/etcd/client.h"

#include <algorithm>
#include <condition_variable>

#include <grpcpp/grpcpp.h>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "rendezvous/channel/channel.h"

namespace crun::etcd {
namespace {

namespace pb = etcdserverpb;

// One member gets at most this long per attempt, so that a silent one is left for the next.
// Each attempt that runs out of time doubles the next one's, up to kMaxAttempt: a cluster too
// busy to answer within 2 s (thousands of agents starting at once) is given longer, instead of
// being sent the same work again every 2 s.
constexpr Millis kAttempt{2'000};
constexpr Millis kMaxAttempt{16'000};

// gRPC takes deadlines on the system clock.
std::chrono::system_clock::time_point SystemDeadline(Clock::time_point deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - Clock::now());
}

KeyValue FromPb(const mvccpb::KeyValue& kv) {
  return {kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()};
}

// The member took longer than the attempt's deadline (the client's, or etcd's own).
bool TimedOut(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         s.error_message().find("deadline exceeded") != std::string::npos ||
         s.error_message().find("timed out") != std::string::npos;
}

// The member is too busy to answer in time: it ran past the attempt's deadline, or refused with
// etcd's own back-pressure ("etcdserver: too many requests": its log's apply is far behind).
bool Busy(const grpc::Status& s) {
  return TimedOut(s) || s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         s.error_message().find("too many requests") != std::string::npos;
}

// Failures that another member, or the same one a moment later, may not have.
bool Retryable(const grpc::Status& s) {
  if (Busy(s) || s.error_code() == grpc::StatusCode::UNAVAILABLE) return true;
  const std::string& m = s.error_message();
  for (const char* sign : {"no leader", "leader changed", "not capable"}) {
    if (m.find(sign) != std::string::npos) return true;
  }
  return false;
}

bool TokenExpired(const grpc::Status& s) {
  return s.error_message().find("invalid auth token") != std::string::npos;
}

void FillOp(const Op& op, pb::RequestOp* out) {
  switch (op.kind) {
    case Op::Kind::kPut: {
      auto* p = out->mutable_request_put();
      p->set_key(op.key);
      p->set_value(op.value);
      p->set_lease(op.lease);
      break;
    }
    case Op::Kind::kDelete:
      out->mutable_request_delete_range()->set_key(op.key);
      break;
    case Op::Kind::kDeletePrefix: {
      auto* d = out->mutable_request_delete_range();
      d->set_key(op.key);
      d->set_range_end(PrefixEnd(op.key));
      break;
    }
    case Op::Kind::kGet:
      out->mutable_request_range()->set_key(op.key);
      break;
    case Op::Kind::kGetPrefix: {
      auto* r = out->mutable_request_range();
      r->set_key(op.key);
      r->set_range_end(PrefixEnd(op.key));
      break;
    }
  }
}

}  // namespace

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = end.back();
    if (static_cast<unsigned char>(last) < 0xff) {
      last = static_cast<char>(static_cast<unsigned char>(last) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

struct Client::Impl {
  ClientOptions o;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<pb::KV::Stub>> kv;
  std::vector<std::unique_ptr<pb::Lease::Stub>> lease;
  std::vector<std::unique_ptr<pb::Watch::Stub>> watch;
  std::vector<std::unique_ptr<pb::Auth::Stub>> auth;
  std::vector<std::unique_ptr<pb::Maintenance::Stub>> maintenance;
  std::atomic<std::size_t> current{0};
  std::mutex token_mu;
  std::string token;

  // A watch on a member the calls have left leaves it too: a member cut off silently keeps
  // a stream open until keepalive gives up on it, and calls notice sooner.
  struct MemberUser {
    virtual ~MemberUser() = default;
    virtual void Left(std::size_t member) = 0;
  };
  std::mutex users_mu;
  std::vector<MemberUser*> users;

  void AddUser(MemberUser* u) {
    std::lock_guard lock(users_mu);
    users.push_back(u);
  }
  void RemoveUser(MemberUser* u) {
    std::lock_guard lock(users_mu);
    users.erase(std::remove(users.begin(), users.end(), u), users.end());
  }

  std::string Endpoints() const {
    std::string out;
    for (const auto& e : o.endpoints) out += (out.empty() ? "" : ",") + e;
    return out;
  }

  // Sets what every call carries: the auth token, and etcd's "fail rather than answer without
  // a leader" for watches.
  void Prepare(grpc::ClientContext& ctx, Clock::time_point deadline) {
    ctx.set_deadline(SystemDeadline(deadline));
    // A member still connecting (or booting) gets the attempt's time; Call moves on after it.
    ctx.set_wait_for_ready(true);
    ctx.AddMetadata("hasleader", "true");
    std::lock_guard lock(token_mu);
    if (!token.empty()) ctx.AddMetadata("token", token);
  }

  void Rotate(std::size_t from) {
    const std::size_t left = from;
    if (!current.compare_exchange_strong(from, (from + 1) % o.endpoints.size())) return;
    std::lock_guard lock(users_mu);
    for (auto* u : users) u->Left(left);
  }

  // A fresh auth token from member `m` (no retry: Call retries).
  grpc::Status Authenticate(std::size_t m, Clock::time_point deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(SystemDeadline(deadline));
    pb::AuthenticateRequest req;
    req.set_name(o.user);
    req.set_password(o.password);
    pb::AuthenticateResponse resp;
    auto s = auth[m]->Authenticate(&ctx, req, &resp);
    if (s.ok()) {
      std::lock_guard lock(token_mu);
      token = resp.token();
    }
    return s;
  }

  // Runs `attempt(member, context)` until it succeeds, fails for good, or `deadline` passes,
  // moving to the next member after each failure another member may not have.
  template <typename F>
  Status Call(const std::string& what, Clock::time_point deadline, F&& attempt) {
    std::string last;
    std::size_t failures = 0;
    Millis pause{20};
    Millis attempt_time = kAttempt;
    while (true) {
      const auto now = Clock::now();
      if (now >= deadline) break;
      const std::size_t m = current.load();
      const auto until = std::min(deadline, now + attempt_time);
      grpc::Status s;
      {
        std::unique_lock lock(token_mu);
        const bool need_token = !o.user.empty() && token.empty();
        lock.unlock();
        if (need_token) s = Authenticate(m, until);
      }
      if (s.ok()) {
        grpc::ClientContext ctx;
        Prepare(ctx, until);
        s = attempt(m, ctx);
      }
      if (s.ok()) return Status::Ok();
      if (TokenExpired(s)) {
        std::lock_guard lock(token_mu);
        token.clear();
        continue;
      }
      const std::string where = "etcd at " + o.endpoints[m];
      if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
          s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
          s.error_message().find("authentication failed") != std::string::npos ||
          s.error_message().find("user name") != std::string::npos) {
        return PermissionDenied(where + " refused " + what + ": " + s.error_message() +
                                (o.user.empty()
                                     ? " (no etcd user given: --rdzv-conf etcd_user=NAME with "
                                       "etcd_password_file=PATH)"
                                     : " (etcd user '" + o.user + "')"));
      }
      if (!Retryable(s)) {
        if (s.error_message().find("requested lease not found") != std::string::npos) {
          return NotFound(where + ": " + what + ": " + s.error_message());
        }
        return InternalError(where + ": " + what + " failed: " + s.error_message());
      }
      last = where + ": " + s.error_message();
      // A busy member: the next try gets longer, and the pause between passes grows to
      // kMaxAttempt / 4.
      const bool busy = Busy(s);
      if (busy) attempt_time = std::min(attempt_time * 2, kMaxAttempt);
      Rotate(m);
      if (++failures % o.endpoints.size() == 0) {
        // Every member failed once: wait a little before the next pass (bounded by deadline).
        std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
        pause = std::min(pause * 2, busy ? kMaxAttempt / 4 : Millis(500));
      }
    }
    std::string hint;
    if (last.find("Socket closed") != std::string::npos ||
        last.find("failed to connect") != std::string::npos ||
        last.find("handshake") != std::string::npos) {
      hint = o.security.tls() ? " (this node uses TLS: does etcd? Its certificate must be signed "
                                "by --tls-ca)"
                              : " (this node speaks plaintext: if etcd uses TLS, give --tls-ca)";
    }
    return Unavailable("no etcd member at " + Endpoints() + " answered " + what + " in time" +
                       (last.empty() ? "" : " (last: " + last + ")") + hint);
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

std::string Client::endpoints() const { return impl_->Endpoints(); }

std::size_t Client::member() const { return impl_->current.load(); }

StatusOr<std::shared_ptr<Client>> Client::Connect(ClientOptions options,
                                                  Clock::time_point deadline) {
  if (options.endpoints.empty()) return InvalidArgument("no etcd endpoint given");
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  impl->current = impl->o.first_member % impl->o.endpoints.size();
  rdzv::ChannelOptions co;
  co.keepalive_timeout = impl->o.keepalive_timeout;
  // etcd's servers refuse pings more often than every 5 s (--grpc-keepalive-min-time) and
  // on a connection without a call (GOAWAY "too_many_pings"). A silent member is noticed by
  // the calls' own deadlines (kAttempt), and the watch leaves it with them (Rotate).
  co.keepalive_interval = std::chrono::seconds(10);
  co.ping_when_idle = false;
  // A connection gets gRPC's own 20 s to come up: a client too busy to finish its handshakes
  // within 2 s (a process of thousands of agents) cut them off and dialled again, and none
  // ever came up. A member that does not answer is left by the calls' deadlines, not this.
  co.min_connect = std::chrono::seconds(20);
  co.max_backoff = kAttempt;
  co.security = impl->o.security;
  for (const auto& e : impl->o.endpoints) {
    auto ch = rdzv::MakeChannel(e, co);
    impl->channels.push_back(ch);
    impl->kv.push_back(pb::KV::NewStub(ch));
    impl->lease.push_back(pb::Lease::NewStub(ch));
    impl->watch.push_back(pb::Watch::NewStub(ch));
    impl->auth.push_back(pb::Auth::NewStub(ch));
    impl->maintenance.push_back(pb::Maintenance::NewStub(ch));
  }
  std::shared_ptr<Client> client(new Client(std::move(impl)));
  // A read proves a member with quorum answers, with our credentials.
  if (!client->impl_->o.probe) return client;
  auto probe = client->Get("crun-connect-probe", deadline);
  if (!probe.ok()) return probe.status();
  return client;
}

StatusOr<RangeResult> Client::Get(const std::string& key, Clock::time_point deadline) {
  pb::RangeRequest req;
  req.set_key(key);
  pb::RangeResponse resp;
  CRUN_RETURN_IF_ERROR(impl_->Call("a read of " + key, deadline, [&](std::size_t m, auto& ctx) {
    return impl_->kv[m]->Range(&ctx, req, &resp);
  }));
  RangeResult out;
  out.revision = resp.header().revision();
  for (const auto& kv : resp.kvs()) out.kvs.push_back(FromPb(kv));
  return out;
}

StatusOr<RangeResult> Client::GetPrefix(const std::string& prefix, Clock::time_point deadline) {
  pb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  pb::RangeResponse resp;
  CRUN_RETURN_IF_ERROR(
      impl_->Call("a read of " + prefix + "*", deadline,
                  [&](std::size_t m, auto& ctx) { return impl_->kv[m]->Range(&ctx, req, &resp); }));
  RangeResult out;
  out.revision = resp.header().revision();
  for (const auto& kv : resp.kvs()) out.kvs.push_back(FromPb(kv));
  return out;
}

StatusOr<std::int64_t> Client::Put(const std::string& key, const std::string& value,
                                   std::int64_t lease, Clock::time_point deadline) {
  pb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  pb::PutResponse resp;
  CRUN_RETURN_IF_ERROR(impl_->Call("a write of " + key, deadline, [&](std::size_t m, auto& ctx) {
    return impl_->kv[m]->Put(&ctx, req, &resp);
  }));
  return resp.header().revision();
}

StatusOr<TxnResult> Client::Txn(const std::vector<Compare>& compares, const std::vector<Op>& then,
                                const std::vector<Op>& otherwise, Clock::time_point deadline) {
  pb::TxnRequest req;
  for (const auto& c : compares) {
    auto* pc = req.add_compare();
    pc->set_key(c.key);
    pc->set_result(pb::Compare::EQUAL);
    switch (c.target) {
      case Compare::Target::kCreateRevision:
        pc->set_target(pb::Compare::CREATE);
        pc->set_create_revision(c.revision);
        break;
      case Compare::Target::kModRevision:
        pc->set_target(pb::Compare::MOD);
        pc->set_mod_revision(c.revision);
        break;
      case Compare::Target::kValue:
        pc->set_target(pb::Compare::VALUE);
        pc->set_value(c.value);
        break;
    }
  }
  for (const auto& op : then) FillOp(op, req.add_success());
  for (const auto& op : otherwise) FillOp(op, req.add_failure());
  pb::TxnResponse resp;
  const std::string what = "a transaction on " + (!compares.empty() ? compares.front().key
                                                  : !then.empty()   ? then.front().key
                                                                    : std::string("keys"));
  CRUN_RETURN_IF_ERROR(impl_->Call(what, deadline, [&](std::size_t m, auto& ctx) {
    return impl_->kv[m]->Txn(&ctx, req, &resp);
  }));
  TxnResult out;
  out.succeeded = resp.succeeded();
  out.revision = resp.header().revision();
  for (const auto& r : resp.responses()) {
    if (r.response_case() != pb::ResponseOp::kResponseRange) continue;
    std::vector<KeyValue> kvs;
    for (const auto& kv : r.response_range().kvs()) kvs.push_back(FromPb(kv));
    out.reads.push_back(std::move(kvs));
  }
  return out;
}

StatusOr<std::int64_t> Client::Grant(std::chrono::seconds ttl, Clock::time_point deadline) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl.count());
  pb::LeaseGrantResponse resp;
  CRUN_RETURN_IF_ERROR(impl_->Call("a lease", deadline, [&](std::size_t m, auto& ctx) {
    return impl_->lease[m]->LeaseGrant(&ctx, req, &resp);
  }));
  if (!resp.error().empty()) return InternalError("etcd refused a lease: " + resp.error());
  return resp.id();
}

StatusOr<std::int64_t> Client::KeepAliveOnce(std::int64_t lease, Clock::time_point deadline) {
  std::int64_t ttl = 0;
  CRUN_RETURN_IF_ERROR(
      impl_->Call("a lease keep-alive", deadline, [&](std::size_t m, grpc::ClientContext& ctx) {
        auto stream = impl_->lease[m]->LeaseKeepAlive(&ctx);
        pb::LeaseKeepAliveRequest req;
        req.set_id(lease);
        pb::LeaseKeepAliveResponse resp;
        if (stream->Write(req) && stream->Read(&resp)) ttl = resp.ttl();
        stream->WritesDone();
        return stream->Finish();
      }));
  if (ttl <= 0) return NotFound("etcd lease " + std::to_string(lease) + " has expired");
  return ttl;
}

Status Client::Revoke(std::int64_t lease, Clock::time_point deadline) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse resp;
  return impl_->Call("a lease revocation", deadline, [&](std::size_t m, auto& ctx) {
    return impl_->lease[m]->LeaseRevoke(&ctx, req, &resp);
  });
}

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
