// The gRPC front end's shared parts (grpc_service.h), private to its three files: Core (what
// the gRPC threads and the engine's thread share: the engine's inbox, the stream registry, the
// calls alive), Call (an operation's tag on a completion queue) and UnaryCall. grpc_service.cc
// runs the server; grpc_sessions.cc holds each agent's Session stream; grpc_unary_calls.cc the
// Status, Stacks and health calls.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <absl/synchronization/mutex.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "base/endpoint.h"
#include "base/handoff.h"
#include "base/log_sampling.h"
#include "base/small_fifo.h"
#include "base/socket.h"
#include "crun/v1/health.grpc.pb.h"
#include "crun/v1/rendezvous.grpc.pb.h"
#include "metrics/endpoint.h"
#include "metrics/registry.h"
#include "rendezvous/beats/beat_datagram.h"
#include "rendezvous/service/beat_receiver.h"
#include "rendezvous/service/engine.h"
#include "rendezvous/service/engine_metrics.h"
#include "rendezvous/service/grpc_service.h"
#include "rendezvous/service/proto_messages.h"
#include "rendezvous/store_server/round_store.h"
#include "rendezvous/store_server/store_server.h"

namespace crun::rdzv::grpc_front {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

class AsyncSession;
template <typename Service, typename Request, typename Response>
class UnaryCall;
// Every method on gRPC's asynchronous API (AsyncSession, UnaryCall). A callback method would
// bring gRPC's own threads polling beside the queues' (seven thread switches a heartbeat).
// Session is raw (bytes both ways): the service encodes each message itself (Core::Encode), a
// round's member list once for every node.
using ServiceBase = v1::Rendezvous::WithRawMethod_Session<v1::Rendezvous::WithAsyncMethod_Status<
    v1::Rendezvous::WithAsyncMethod_Stacks<v1::Rendezvous::Service>>>;
using StacksCall = UnaryCall<ServiceBase, v1::StacksQuery, v1::StacksResult>;
// How long a heartbeat may wait for the engine's thread (Core::Queue).
inline constexpr std::chrono::milliseconds kHeartbeatBatch{20};
// The least time between two of the engine's turns taken for urgent messages (Core::Queue).
inline constexpr std::chrono::microseconds kUrgentGap{1000};
// Everything the gRPC threads and the engine's thread share. Engine, timer and stores are
// touched on the engine's thread only; the registry of live streams under its mutex.
struct Core {
  explicit Core(ServiceOptions o) : options(std::move(o)), timer(io) {}

  void SendTo(SessionId id, const msg::ServiceMessage& m);
  // `m` on the wire (the engine's thread). An assignment's member list, the same object for
  // every node of a round, is encoded once and its bytes shared (reference-counted slices).
  grpc::ByteBuffer Encode(const msg::ServiceMessage& m);
  std::shared_ptr<const std::vector<msg::RoundMember>> encoded_members;
  grpc::Slice encoded_members_bytes;
  // Messages from the gRPC threads queue in the inbox, each with the time it arrived; the
  // engine's thread takes everything queued in one turn. A heartbeat does not wake it: the
  // heartbeats of kHeartbeatBatch wait for one turn (at 10,000 agents, one wake-up instead of
  // 200). Anything else wakes it at once (within kUrgentGap of its last turn: a storm of
  // 30,000 joins woke it once a join, a third of its thread switches) and takes the waiting
  // heartbeats along, in order, and the engine's own deadlines take them first, so no node is
  // judged on a stale beat.
  // A stream's end goes the same way, so it is never handled before its last message.
  // Converted here, on the gRPC thread; a message of no kind the service knows is dropped.
  void Received(SessionId id, const v1::AgentMessage& m, const std::string& peer_ip) {
    auto message = FromProto(m);
    if (!message) return;
    std::string peer = m.has_join() ? peer_ip : std::string();
    const bool urgent = !std::holds_alternative<msg::Heartbeat>(*message);
    Queue({id, std::move(*message), Clock::now(), false, std::move(peer)}, urgent);
  }
  void Closed(SessionId id) { Queue({id, {}, Clock::now(), true, {}}, true); }
  // OK when the call carries the job token (or none is needed); else the refusal, logged.
  grpc::Status Authorize(const grpc::ServerContextBase* context, const char* call);
  // Keeps one timer on the engine's next deadline.
  void Rearm() {
    if (!engine) return;  // stopping: the engine is gone, and so is every deadline
    auto wake = engine->NextWake();
    if (wake == armed) return;
    armed = wake;
    if (!wake) {
      timer.cancel();
      return;
    }
    timer.expires_at(*wake);
    timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec || !engine) return;
      armed.reset();
      TakeInbox();
      engine->OnTick(Clock::now());
      Rearm();
    });
  }

  ServiceOptions options;
  asio::io_context io;
  asio::steady_timer timer;
  std::optional<Clock::time_point> armed;
  std::unique_ptr<Engine> engine;
  std::atomic<SessionId> next_session{1};
  struct Arrival {
    SessionId session;
    msg::AgentMessage message;
    Clock::time_point at;
    bool closed;
    std::string peer_ip;  // joins only
  };
  void Queue(Arrival a, bool urgent) {
    bool drain = false;
    bool batch = false;
    Clock::time_point drain_at;
    {
      std::lock_guard lock(inbox_mu);
      inbox.push_back(std::move(a));
      if (drain_posted) return;
      if (urgent) {
        drain = drain_posted = true;
        drain_at = last_turn + kUrgentGap;
      } else if (!batch_armed) {
        batch = batch_armed = true;
      }
    }
    if (drain && drain_at <= Clock::now()) {
      asio::post(io, [this] { DrainInbox(); });
    } else if (drain) {
      asio::post(io, [this, drain_at] {
        urgent_timer.expires_at(drain_at);
        urgent_timer.async_wait([this](const boost::system::error_code& ec) {
          if (!ec) DrainInbox();
        });
      });
    }
    if (batch) {
      asio::post(io, [this] {
        batch_timer.expires_after(kHeartbeatBatch);
        batch_timer.async_wait([this](const boost::system::error_code& ec) {
          if (ec) return;
          {
            std::lock_guard lock(inbox_mu);
            batch_armed = false;
          }
          DrainInbox();
        });
      });
    }
  }
  void DrainInbox() {
    TakeInbox();
    if (engine) Rearm();
  }
  // Hands the engine everything queued.
  void TakeInbox() {
    std::vector<Arrival> batch;
    {
      std::lock_guard lock(inbox_mu);
      batch.swap(inbox);
      drain_posted = false;
      last_turn = Clock::now();
    }
    if (!engine) return;
    for (auto& a : batch) {
      if (a.closed) {
        engine->OnSessionClosed(a.session, a.at);
      } else {
        engine->OnMessage(a.session, a.message, a.at, a.peer_ip);
      }
    }
  }
  std::mutex inbox_mu;  // the four below
  std::vector<Arrival> inbox;
  bool drain_posted = false;    // a DrainInbox is on its way
  bool batch_armed = false;     // heartbeats wait for batch_timer
  Clock::time_point last_turn;  // the engine's thread last took the inbox
  asio::steady_timer batch_timer{io};
  asio::steady_timer urgent_timer{io};  // an urgent message within kUrgentGap of the last turn
  // Stacks calls waiting for the engine's answer (the engine's thread only).
  std::unordered_map<std::uint64_t, StacksCall*> stacks_calls;
  std::uint64_t next_stacks_call = 1;
  bool stopping = false;  // no more Stacks calls are taken
  void EndStacksCalls();
  std::mutex mu;
  std::unordered_map<SessionId, AsyncSession*> streams;
  void Register(SessionId id, AsyncSession* s) {
    std::lock_guard lock(mu);
    streams[id] = s;
  }
  void Unregister(SessionId id) {
    std::lock_guard lock(mu);
    streams.erase(id);
  }
  std::atomic<bool> shutting_down{false};  // no new session is awaited
  // The calls alive on the queues (Call), awaited before the queues shut down.
  void CallBegins() {
    std::lock_guard lock(calls_mu);
    ++calls;
  }
  void CallEnds() {
    std::lock_guard lock(calls_mu);
    if (--calls == 0) calls_cv.notify_all();
  }
  bool WaitNoCalls(std::chrono::seconds within) {
    std::unique_lock lock(calls_mu);
    return calls_cv.wait_for(lock, within, [this] { return calls == 0; });
  }
  std::size_t CallsAlive() {
    std::lock_guard lock(calls_mu);
    return calls;
  }
  std::mutex calls_mu;
  std::condition_variable calls_cv;
  std::size_t calls = 0;
  std::atomic<std::uint64_t> refused_calls{0};
  std::atomic<std::uint64_t> malformed_messages{0};  // Session messages that did not parse
  // Heartbeats over UDP (options.udp_heartbeats; null when off or not bindable).
  std::unique_ptr<BeatReceiver> beats;
  // A datagram taken (the engine's thread): a heartbeat from the session, as on the stream (the
  // receiver has acked it already).
  void BeatArrived(SessionId id, const v1::Heartbeat& beat) {
    v1::AgentMessage m;
    *m.mutable_heartbeat() = beat;
    if (auto message = FromProto(m); message && engine) {
      engine->OnMessage(id, *message, Clock::now(), {});
    }
  }
  void SendWire(SessionId id, const grpc::ByteBuffer& wire);
  // Prometheus metrics (options.metrics): counted on any thread, the page rendered on the
  // engine's.
  metrics::Registry registry;
  std::unique_ptr<EngineMetrics> engine_metrics;
  std::unique_ptr<http::HttpServer> metrics_server;
};

// A call on a completion queue: each operation's tag names the call and which operation it
// was; the queue's thread hands it back with On. Core counts the calls alive: a queue is shut
// down only once none is left to start an operation on it.
class Call {
 public:
  struct Tag {
    Call* call;
    int op;
  };
  explicit Call(Core* core) : core_(core) { core_->CallBegins(); }
  virtual ~Call() { core_->CallEnds(); }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  virtual void On(int op, bool ok) = 0;
  static void Handle(void* tag, bool ok) {
    Taken(tag);
    auto* t = static_cast<Tag*>(tag);
    t->call->On(t->op, ok);
  }

 protected:
  // The tag of an operation handed to gRPC now: what this thread wrote of the call is seen by
  // the thread that takes the tag back (base/handoff.h: for ThreadSanitizer's sake).
  Tag* Issue(Tag* tag) {
    Handed(tag);
    return tag;
  }

  Core* core_;
};

// A unary call (Status, Stacks, the health check) on the asynchronous API: rare, answered
// from the engine's thread. Each arrival puts the next request on the same queue.
template <typename Service, typename Request, typename Response>
class UnaryCall final : public Call {
 public:
  using RequestMethod = void (Service::*)(grpc::ServerContext*, Request*,
                                          grpc::ServerAsyncResponseWriter<Response>*,
                                          grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                          void*);
  // Called on the queue's thread once the call is authorized; it must Answer, on any thread.
  using Handler = void (*)(Core*, UnaryCall*);
  struct Method {
    const char* name;
    RequestMethod request;
    Handler handler;
    bool open = false;  // answered without the job token (health checks)
  };

  static void Await(Core* core, Service* service, grpc::ServerCompletionQueue* cq,
                    const Method& method) {
    auto* call = new UnaryCall(core, service, cq, method);
    (service->*method.request)(&call->context_, &call->request_, &call->responder_, cq, cq,
                               call->Issue(&call->tags_[kArrived]));
  }

  const Request& request() const { return request_; }
  Response* response() { return &response_; }
  void Answer(const grpc::Status& status) {
    if (status.ok()) {
      responder_.Finish(response_, status, Issue(&tags_[kAnswered]));
    } else {
      responder_.FinishWithError(status, Issue(&tags_[kAnswered]));
    }
  }

 private:
  enum Op { kArrived, kAnswered };
  UnaryCall(Core* core, Service* service, grpc::ServerCompletionQueue* cq, Method method)
      : Call(core), service_(service), cq_(cq), method_(method), responder_(&context_) {
    tags_[kArrived] = {this, kArrived};
    tags_[kAnswered] = {this, kAnswered};
  }

  void On(int op, bool ok) override {
    if (op == kAnswered || !ok) {  // answered, or the server is shutting down
      delete this;
      return;
    }
    if (!core_->shutting_down.load()) Await(core_, service_, cq_, method_);
    if (!method_.open) {
      if (auto s = core_->Authorize(&context_, method_.name); !s.ok()) return Answer(s);
    }
    method_.handler(core_, this);
  }

  Service* service_;
  grpc::ServerCompletionQueue* cq_;
  Method method_;
  grpc::ServerContext context_;
  Request request_;
  Response response_;
  grpc::ServerAsyncResponseWriter<Response> responder_;
  Tag tags_[2];
};

// The standard health service (proto/crun/v1/health.proto), open to anyone as gRPC's
// own is (a Kubernetes probe carries no token): SERVING for the server ("") and for
// crun.v1.Rendezvous until the service stops.
namespace health = grpc::health::v1;
using HealthService = health::Health::AsyncService;
using HealthCall =
    UnaryCall<HealthService, health::HealthCheckRequest, health::HealthCheckResponse>;

// Puts a new Session stream on `cq` (grpc_sessions.cc); each one arrived awaits the next.
void AwaitSession(Core* core, ServiceBase* service, grpc::ServerCompletionQueue* cq);
// Puts the unary calls and the health watch on `cq` (grpc_unary_calls.cc).
void AwaitUnaryCalls(Core* core, ServiceBase* service, HealthService* health,
                     grpc::ServerCompletionQueue* cq);

}  // namespace crun::rdzv::grpc_front
