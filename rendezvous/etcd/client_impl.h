// Client's state (client.h) for its calls (client.cc) and its watches (watch.cc): a channel
// and stubs per member, the auth token, the calls' member, and the watches told when the calls
// leave one. Private to those two files.
#pragma once

#include <algorithm>
#include <condition_variable>

#include <grpcpp/grpcpp.h>

#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "rendezvous/channel/channel.h"
#include "rendezvous/etcd/client.h"

namespace crun::etcd {

namespace pb = etcdserverpb;

// One member gets at most this long per attempt, so that a silent one is left for the next.
// Each attempt that runs out of time doubles the next one's, up to kMaxAttempt: a cluster too
// busy to answer within 2 s (thousands of agents starting at once) is given longer, instead of
// being sent the same work again every 2 s.
inline constexpr Millis kAttempt{2'000};
inline constexpr Millis kMaxAttempt{16'000};

// gRPC takes deadlines on the system clock.
inline std::chrono::system_clock::time_point SystemDeadline(Clock::time_point deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - Clock::now());
}

inline KeyValue FromPb(const mvccpb::KeyValue& kv) {
  return {kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()};
}

// The member took longer than the attempt's deadline (the client's, or etcd's own).
inline bool TimedOut(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         s.error_message().find("deadline exceeded") != std::string::npos ||
         s.error_message().find("timed out") != std::string::npos;
}

// The member is too busy to answer in time: it ran past the attempt's deadline, or refused with
// etcd's own back-pressure ("etcdserver: too many requests": its log's apply is far behind).
inline bool Busy(const grpc::Status& s) {
  return TimedOut(s) || s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         s.error_message().find("too many requests") != std::string::npos;
}

// Failures that another member, or the same one a moment later, may not have.
inline bool Retryable(const grpc::Status& s) {
  if (Busy(s) || s.error_code() == grpc::StatusCode::UNAVAILABLE) return true;
  const std::string& m = s.error_message();
  for (const char* sign : {"no leader", "leader changed", "not capable"}) {
    if (m.find(sign) != std::string::npos) return true;
  }
  return false;
}

inline bool TokenExpired(const grpc::Status& s) {
  return s.error_message().find("invalid auth token") != std::string::npos;
}

std::string PrefixEnd(const std::string& prefix);

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

}  // namespace crun::etcd
