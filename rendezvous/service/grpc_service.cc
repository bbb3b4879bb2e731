#include "rendezvous/service/grpc_service.h"

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
#include "rendezvous/service/proto_messages.h"
#include "rendezvous/store_server/round_store.h"
#include "rendezvous/store_server/store_server.h"

namespace crun::rdzv {
namespace {

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
constexpr std::chrono::milliseconds kHeartbeatBatch{20};
// The least time between two of the engine's turns taken for urgent messages (Core::Queue).
constexpr std::chrono::microseconds kUrgentGap{1000};
// How long Stop waits for the cancelled calls' last operations to come back.
constexpr std::chrono::seconds kCallsEndWithin{10};
// Completion queues the sessions are spread over, a thread each (see AsyncSession).
constexpr int kSessionQueues = 16;

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const Security& s) {
  if (!s.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(
      s.ca_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                       : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = s.ca_pem;  // with a CA, client certificates are required (mutual TLS)
  o.pem_key_cert_pairs.push_back({s.key_pem, s.cert_pem});
  return grpc::SslServerCredentials(o);
}

class StoreHandle final : public RoundStore {
 public:
  explicit StoreHandle(std::unique_ptr<StoreServer> s) : server_(std::move(s)) {}
  ~StoreHandle() override { server_->Stop(); }
  std::uint16_t port() const override { return server_->port(); }

 private:
  std::unique_ptr<StoreServer> server_;
};

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

grpc::Status Core::Authorize(const grpc::ServerContextBase* context, const char* call) {
  const std::string& token = options.security.token;
  if (token.empty()) return grpc::Status::OK;
  const auto& md = context->client_metadata();
  const auto it = md.find(kTokenHeader);
  const bool given = it != md.end();
  if (given && TokenMatches(token, std::string_view(it->second.data(), it->second.size()))) {
    return grpc::Status::OK;
  }
  const auto n = refused_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  const std::string why = given ? "a wrong job token" : "no job token";
  if (engine_metrics) engine_metrics->Refused(given ? kRefusedWrongToken : kRefusedNoToken);
  if (WorthLogging(n)) {
    spdlog::warn("refused {} call #{} from {}: {}", call, n, PeerIp(context->peer()), why);
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      given ? "the job token does not match the rendezvous service's"
                            : "the rendezvous service requires a job token: give every node "
                              "the job's token (--token-file, CRUN_TOKEN_FILE or CRUN_TOKEN)");
}

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

// One agent's Session stream, on gRPC's asynchronous API. The callback API puts every
// operation of the process on one completion queue, and Debian's gRPC (built without NDEBUG)
// scans that queue's outstanding operations at each completion: O(agents) per message, 45 % of
// the daemon's CPU at 30,000 agents. Here the sessions are spread over kSessionQueues queues,
// each drained by one thread that handles its completions itself (no hand-off to a pool).
//
// Each operation has a tag of its own. A read is pending for as long as the stream lasts: its
// failure is the stream's end, however it came (the agent closed its side, cancelled, or the
// connection broke). The session then finishes the call once no write is in flight, and lives
// until the finish is back: one outstanding operation per idle agent.
// Send comes from the engine's thread (under Core::mu); everything else from the queue's one
// thread. The session's mutex orders the two.
class AsyncSession final : public Call {
 public:
  AsyncSession(Core* core, ServiceBase* service, grpc::ServerCompletionQueue* cq)
      : Call(core), service_(service), cq_(cq), stream_(&context_) {
    for (int i = 0; i < kOps; ++i) tags_[i] = {this, i};
  }

  // Waits for the next agent to open a session on this queue.
  void Request() {
    service_->RequestSession(&context_, &stream_, cq_, cq_, Issue(&tags_[kRequest]));
  }

  void Send(const grpc::ByteBuffer& m) {
    std::lock_guard lock(mu_);
    if (closed_) return;
    queue_.push_back(m);  // the slices' references, not their bytes
    if (!writing_) WriteNext();
  }

 private:
  enum Op { kRequest, kMetadata, kRead, kWrite, kFinish, kOps };

  void On(int op, bool ok) override {
    if (op == kRequest) return Started(ok);
    bool ended = false;
    bool last = false;
    {
      std::lock_guard lock(mu_);
      if (op == kMetadata || op == kWrite) {
        writing_ = false;
        if (op == kWrite && !queue_.empty()) queue_.pop_front();
        if (!ok) Close();
        if (!queue_.empty() && !closed_) WriteNext();
      } else if (op == kRead && ok) {
        v1::AgentMessage m;
        const bool parsed = grpc::SerializationTraits<v1::AgentMessage>::Deserialize(&in_, &m).ok();
        in_.Clear();
        if (parsed) {
          core_->Received(id_, m, peer_ip_);
          Read();
        } else {
          // Bytes that are no AgentMessage: not crun's agent, or a broken one. The stream ends
          // as a failed read ends it (the typed API would have failed the call), and the
          // engine hears of a lost session; the peer is told why.
          Malformed();
          ended = true;
          Close();
        }
      } else if (op == kRead) {
        ended = true;
        Close();
      }
      // Closed (so no Send starts a write) before the call is finished.
      if (closed_ && !writing_ && !finished_) {
        finished_ = true;
        ++outstanding_;
        stream_.Finish(finish_status_, Issue(&tags_[kFinish]));
      }
      last = --outstanding_ == 0;
    }
    if (ended || last) End();
    if (last) delete this;
  }

  // A call arrived (ok), or the server is shutting down (not ok).
  void Started(bool ok) {
    if (!ok) {
      delete this;
      return;
    }
    if (!core_->shutting_down.load()) (new AsyncSession(core_, service_, cq_))->Request();
    if (core_->engine_metrics) core_->engine_metrics->sessions_total.With().Inc();
    {
      std::lock_guard lock(mu_);
      outstanding_ = 0;
      if (auto s = core_->Authorize(&context_, "Session"); !s.ok()) {
        closed_ = finished_ = true;
        ++outstanding_;
        stream_.Finish(s, Issue(&tags_[kFinish]));
        return;
      }
      id_ = core_->next_session++;
      peer_ip_ = PeerIp(context_.peer());
      registered_ = true;
      if (core_->beats) {
        const BeatTicket ticket{core_->beats->port(), id_, core_->beats->Add(id_)};
        context_.AddInitialMetadata(kBeatTicketHeader, FormatBeatTicket(ticket));
      }
      // At once, before any message: the agent then knows its session was open, so that
      // losing it is a lost service in every phase, gathering too (reconnect_timeout bounds
      // the wait).
      writing_ = true;
      ++outstanding_;
      stream_.SendInitialMetadata(Issue(&tags_[kMetadata]));
      Read();
    }
    // Visible to the engine's Send only now, outside the session's mutex: Send runs under
    // Core::mu and then takes the session's, so taking Core::mu under the session's would
    // invert that order (ThreadSanitizer: lock-order inversion). Nothing of this session
    // completes meanwhile: its operations complete on this same thread, after Started.
    core_->Register(id_, this);
  }

  void Read() {
    ++outstanding_;
    stream_.Read(&in_, Issue(&tags_[kRead]));
  }
  void WriteNext() {
    writing_ = true;
    ++outstanding_;
    stream_.Write(queue_.front(), Issue(&tags_[kWrite]));
  }
  void Malformed() {
    const auto n = core_->malformed_messages.fetch_add(1, std::memory_order_relaxed) + 1;
    if (core_->engine_metrics) core_->engine_metrics->Refused(kRefusedMalformed);
    if (WorthLogging(n)) {
      spdlog::warn("ended the session of {} (session {}): message #{} that is no AgentMessage",
                   peer_ip_, id_, n);
    }
    finish_status_ = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  "a message on the Session stream does not parse as "
                                  "crun.v1.AgentMessage: the session is ended");
  }
  // No more writes: what is queued is dropped (the stream ended or failed).
  void Close() {
    closed_ = true;
    if (!writing_) queue_.clear();
  }
  // The stream's end, told once: no Send reaches the session after it, and the engine hears
  // of the end after the session's last message.
  void End() {
    if (!registered_) return;
    registered_ = false;
    core_->Unregister(id_);
    if (core_->beats) core_->beats->Remove(id_);
    core_->Closed(id_);
  }

  ServiceBase* service_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  Tag tags_[kOps];
  SessionId id_ = 0;
  std::string peer_ip_;
  bool registered_ = false;  // the queue's thread only
  grpc::ByteBuffer in_;
  std::mutex mu_;  // the fields below
  // The front is being written while writing_. It may move while written (a push_back that
  // grows the vector): Write duplicates the buffer (its slices' references) when called.
  // SmallFifo, not std::deque: an idle session's queue holds no heap (a deque, about 600 B).
  SmallFifo<grpc::ByteBuffer> queue_;
  bool writing_ = false;
  bool closed_ = false;
  bool finished_ = false;
  grpc::Status finish_status_;  // OK unless the agent sent what does not parse
  int outstanding_ = 1;         // the request
};

void Core::SendTo(SessionId id, const msg::ServiceMessage& m) { SendWire(id, Encode(m)); }

void Core::SendWire(SessionId id, const grpc::ByteBuffer& wire) {
  std::lock_guard lock(mu);
  if (auto it = streams.find(id); it != streams.end()) it->second->Send(wire);
}

grpc::ByteBuffer Core::Encode(const msg::ServiceMessage& m) {
  const auto* a = std::get_if<msg::Assignment>(&m);
  if (a == nullptr || !a->members || a->members->empty()) {
    grpc::ByteBuffer out;
    bool own = false;
    (void)grpc::SerializationTraits<v1::ServiceMessage>::Serialize(ToProto(m), &out, &own);
    return out;
  }
  if (a->members != encoded_members) {
    encoded_members = a->members;
    encoded_members_bytes = grpc::Slice(EncodeMembers(*a->members));
  }
  grpc::Slice pieces[] = {grpc::Slice(EncodeAssignmentHead(*a, encoded_members_bytes.size())),
                          encoded_members_bytes};
  return grpc::ByteBuffer(pieces, 2);
}

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

using StatusCall = UnaryCall<ServiceBase, v1::StatusRequest, v1::StatusResponse>;

const StatusCall::Method kStatusMethod{"Status", &ServiceBase::RequestStatus,
                                       [](Core* core, StatusCall* call) {
                                         asio::post(core->io, [core, call] {
                                           if (core->engine) {
                                             *call->response() = ToProto(
                                                 core->engine->Status(call->request().run_id(),
                                                                      Clock::now()));
                                           }
                                           call->Answer(grpc::Status::OK);
                                         });
                                       }};

const StacksCall::Method kStacksMethod{
    "Stacks", &ServiceBase::RequestStacks, [](Core* core, StacksCall* call) {
      asio::post(core->io, [core, call] {
        if (!core->engine || core->stopping) {
          return call->Answer(
              grpc::Status(grpc::StatusCode::UNAVAILABLE, "the service is stopping"));
        }
        const std::uint64_t query = core->next_stacks_call++;
        core->stacks_calls[query] = call;
        const auto& r = call->request();
        const auto asked =
            core->engine->AskStacks(r.run_id(), query, Millis(r.timeout_ms()), Clock::now());
        if (!asked.ok()) {
          core->stacks_calls.erase(query);
          call->Answer(grpc::Status(grpc::StatusCode::NOT_FOUND, asked.message()));
        }
        core->Rearm();
      });
    }};

// The standard health service (proto/crun/v1/health.proto), open to anyone as gRPC's
// own is (a Kubernetes probe carries no token): SERVING for the server ("") and for
// crun.v1.Rendezvous until the service stops.
namespace health = grpc::health::v1;
using HealthService = health::Health::AsyncService;
using HealthCall =
    UnaryCall<HealthService, health::HealthCheckRequest, health::HealthCheckResponse>;

std::optional<health::HealthCheckResponse::ServingStatus> HealthOf(const Core* core,
                                                                   const std::string& service) {
  if (!service.empty() && service != v1::Rendezvous::service_full_name()) return std::nullopt;
  return core->shutting_down.load() ? health::HealthCheckResponse::NOT_SERVING
                                    : health::HealthCheckResponse::SERVING;
}

const HealthCall::Method kHealthCheck{"Health/Check", &HealthService::RequestCheck,
                                      [](Core* core, HealthCall* call) {
                                        const std::string& name = call->request().service();
                                        const auto status = HealthOf(core, name);
                                        if (!status) {
                                          return call->Answer(
                                              grpc::Status(grpc::StatusCode::NOT_FOUND,
                                                           "this server has no service named '" +
                                                               name + "'"));
                                        }
                                        call->response()->set_status(*status);
                                        call->Answer(grpc::Status::OK);
                                      },
                                      true};

// Health/Watch: the status at once (SERVICE_UNKNOWN for a service this server does not have),
// then the stream is held until the caller ends it or the server stops.
class HealthWatch final : public Call {
 public:
  static void Await(Core* core, HealthService* service, grpc::ServerCompletionQueue* cq) {
    auto* w = new HealthWatch(core, service, cq);
    // Returned only if the call starts.
    w->context_.AsyncNotifyWhenDone(w->Issue(&w->tags_[kDone]));
    service->RequestWatch(&w->context_, &w->request_, &w->writer_, cq, cq,
                          w->Issue(&w->tags_[kArrived]));
  }

 private:
  enum Op { kArrived, kWritten, kDone };
  HealthWatch(Core* core, HealthService* service, grpc::ServerCompletionQueue* cq)
      : Call(core), service_(service), cq_(cq), writer_(&context_) {
    for (int i = 0; i <= kDone; ++i) tags_[i] = {this, i};
  }

  void On(int op, bool ok) override {
    if (op == kArrived) {
      if (!ok) {
        delete this;
        return;
      }
      if (!core_->shutting_down.load()) Await(core_, service_, cq_);
      outstanding_ = 2;  // the write and the done tag
      const auto status = HealthOf(core_, request_.service());
      response_.set_status(status ? *status : health::HealthCheckResponse::SERVICE_UNKNOWN);
      writer_.Write(response_, Issue(&tags_[kWritten]));
      return;
    }
    if (--outstanding_ == 0) delete this;
  }

  HealthService* service_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext context_;
  health::HealthCheckRequest request_;
  health::HealthCheckResponse response_;
  grpc::ServerAsyncWriter<health::HealthCheckResponse> writer_;
  Tag tags_[3];
  int outstanding_ = 0;  // once arrived
};

void Core::EndStacksCalls() {
  stopping = true;
  for (auto& [query, call] : stacks_calls) {
    call->Answer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the service is stopping"));
  }
  stacks_calls.clear();
}

class GrpcRendezvousService final : public RendezvousService {
 public:
  explicit GrpcRendezvousService(const ServiceOptions& options)
      : core_(std::make_unique<Core>(options)) {}
  ~GrpcRendezvousService() override { Stop(std::chrono::milliseconds(200)); }

  // The engine, then the gRPC server, then the metrics endpoint, then the engine's thread.
  Status Init() {
    core_->engine = std::make_unique<Engine>(Hooks(), EngineOptionsFor());
    CRUN_RETURN_IF_ERROR(Listen());
    if (core_->options.metrics) {
      if (Status s = ServeMetrics(); !s.ok()) {
        core_->shutting_down = true;
        server_->Shutdown();
        server_->Wait();
        EndQueues();
        server_.reset();
        return s;
      }
    }
    if (Core* core = core_.get(); core->beats) {
      core->beats->Start([core](std::uint64_t id,
                                const v1::Heartbeat& beat) { core->BeatArrived(id, beat); },
                         [core] { core->TakeInbox(); }, [core] { core->Rearm(); });
    }
    thread_ = std::thread([this] {
      auto work = asio::make_work_guard(core_->io);
      core_->io.run();
    });
    return Status::Ok();
  }

  std::uint16_t port() const override { return port_; }
  std::string metrics_url() const override { return metrics_url_; }

  void Stop(std::chrono::milliseconds grace) override {
    if (stopped_.exchange(true)) return;
    if (thread_.joinable()) {
      // Stacks calls wait on the engine, not on the server: they end first, or Wait would.
      std::promise<void> ended;
      asio::post(core_->io, [this, &ended] {
        core_->EndStacksCalls();
        if (core_->metrics_server) core_->metrics_server->Stop();
        ended.set_value();
      });
      ended.get_future().wait();
    }
    core_->shutting_down = true;
    if (server_) {
      // Sessions still open after the grace are cancelled; a Status call in flight completes
      // (the engine's thread keeps running until below). The queues' threads see the
      // sessions out meanwhile.
      server_->Shutdown(std::chrono::system_clock::now() + grace);
      server_->Wait();
    }
    EndQueues();
    if (thread_.joinable()) {
      asio::post(core_->io, [this] {
        core_->timer.cancel();
        core_->batch_timer.cancel();
        core_->urgent_timer.cancel();
        if (core_->beats) core_->beats->Stop();
        core_->engine.reset();  // closes the stores, on their own thread
        core_->io.stop();
      });
      thread_.join();
    }
  }

  ServiceStats stats() override {
    std::promise<ServiceStats> p;
    auto f = p.get_future();
    asio::post(core_->io, [this, &p] {
      ServiceStats s;
      s.refused_calls = core_->refused_calls.load(std::memory_order_relaxed);
      if (core_->engine) {
        s.sessions = core_->engine->live_sessions();
        s.jobs = core_->engine->Status("", Clock::now()).jobs.size();
      }
      p.set_value(s);
    });
    return f.get();
  }

 private:
  // How the engine reaches the sessions, starts a round's store, logs and answers Stacks.
  EngineHooks Hooks() {
    EngineHooks hooks;
    Core* core = core_.get();
    hooks.send = [core](SessionId id, const msg::ServiceMessage& m) { core->SendTo(id, m); };
    hooks.start_store = [core](const std::string&, int, int world_size,
                               const std::vector<std::vector<std::string>>& members)
        -> StatusOr<std::unique_ptr<RoundStore>> {
      RoundStoreSpec spec;
      spec.bind_host = core->options.host;
      spec.world_size = world_size;
      if (core->options.store_allow_list) spec.members = members;
      spec.host_runs_workers = false;  // the service's host is no member as such
      spec.max_connections_per_peer = core->options.store_connections_per_peer;
      auto server = StoreServer::Start(core->io, RoundStoreOptions(spec));
      if (!server.ok()) return server.status();
      return std::unique_ptr<RoundStore>(std::make_unique<StoreHandle>(std::move(server).value()));
    };
    if (core_->options.log_decisions) {
      hooks.log = [](const std::string& line) { spdlog::info("{}", line); };
    }
    hooks.stacks_done = [core](std::uint64_t query, const msg::StacksResult& result) {
      auto it = core->stacks_calls.find(query);
      if (it == core->stacks_calls.end()) return;
      *it->second->response() = ToProto(result);
      it->second->Answer(grpc::Status::OK);
      core->stacks_calls.erase(it);
    };
    return hooks;
  }

  // The engine's options; with metrics, its series, refreshed at each scrape.
  EngineOptions EngineOptionsFor() {
    const auto& o = core_->options;
    EngineOptions eo;
    eo.advertise_addr = o.advertise_addr;
    eo.keep_finished_jobs = o.keep_finished_jobs;
    eo.durable = o.durable;
    if (!o.metrics) return eo;
    Core* core = core_.get();
    core_->engine_metrics = std::make_unique<EngineMetrics>(core_->registry);
    eo.metrics = core_->engine_metrics.get();
    // The datagrams' counts live in the receiver; each scrape adds what came since the last.
    auto& datagrams = core_->registry.AddCounter(
        "crun_rendezvous_beat_datagrams_total",
        "Heartbeat datagrams read, by result: taken, forged (not the session key's tag), stale "
        "(a sequence not above the last taken), unknown_session, malformed",
        {"result"});
    auto& unsent = core_->registry.AddCounter(
        "crun_rendezvous_beat_acks_unsent_total",
        "Heartbeat acks not sent: the UDP socket's send buffer was full (the agent counts the "
        "beat as unanswered)");
    auto& dropped = core_->registry.AddCounter(
        "crun_rendezvous_beat_datagrams_dropped_total",
        "Heartbeat datagrams the kernel dropped unread: the UDP socket's receive buffer was full");
    struct Source {
      metrics::Counter* counter;
      const std::atomic<std::uint64_t>* count;
      std::uint64_t reported = 0;
    };
    // The receiver opens after the engine (Listen): its counts are found at the first scrape.
    auto sources = std::make_shared<std::vector<Source>>();
    core_->registry.OnScrape([core, &datagrams, &unsent, &dropped, sources] {
      if (!core->beats) return;
      if (sources->empty()) {
        const auto& c = core->beats->counts();
        *sources = {{&datagrams.With({"taken"}), &c.taken},
                    {&datagrams.With({"forged"}), &c.forged},
                    {&datagrams.With({"stale"}), &c.stale},
                    {&datagrams.With({"unknown_session"}), &c.unknown},
                    {&datagrams.With({"malformed"}), &c.malformed},
                    {&unsent.With(), &c.acks_unsent},
                    {&dropped.With(), &c.dropped}};
      }
      for (auto& s : *sources) {
        const auto now = s.count->load(std::memory_order_relaxed);
        s.counter->Inc(static_cast<double>(now - s.reported));
        s.reported = now;
      }
    });
    core_->registry.OnScrape([core] {  // on the engine's thread, where the page is rendered
      if (core->engine) core->engine->RefreshMetrics();
      std::size_t open = 0;
      {
        std::lock_guard lock(core->mu);
        open = core->streams.size();
      }
      core->engine_metrics->sessions.With().Set(static_cast<double>(open));
    });
    return eo;
  }

  // The gRPC server on options.host:port (0: a free port, read back into port_).
  Status Listen() {
    const auto& o = core_->options;
    // gRPC says only "failed" when it cannot listen: find out why first (in use, not an
    // address of this host, no permission), as the store server says it.
    CRUN_RETURN_IF_ERROR(CheckCanListen(o.host, o.port));
    // Debian's abseil is built without NDEBUG, so every absl::Mutex that gRPC takes also
    // records the lock order for deadlock detection: ~8 % of the daemon's CPU while 30,000
    // agents form. A process-wide setting; the service is what this process is busy with.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    grpc::ServerBuilder builder;
    const std::string address = FormatEndpoint(o.host, o.port);
    int selected = 0;
    builder.AddListeningPort(address, ServerCredentials(o.security), &selected);
    builder.RegisterService(&service_);
    builder.RegisterService(&health_);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a second daemon must fail
    // Agents ping to notice a dead service quickly; let them.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 200);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    for (int i = 0; i < kSessionQueues; ++i) queues_.push_back(builder.AddCompletionQueue());
    server_ = builder.BuildAndStart();
    if (!server_ || selected == 0) {
      server_.reset();
      EndQueues();
      return Unavailable("cannot listen on " + address +
                         " (address in use, not an address of this host, or no permission)");
    }
    port_ = static_cast<std::uint16_t>(selected);
    if (o.udp_heartbeats) {
      auto beats = BeatReceiver::Open(core_->io, o.host, port_, kHeartbeatBatch);
      if (beats.ok()) {
        core_->beats = std::move(beats).value();
      } else {
        spdlog::warn("{}; agents beat on their gRPC streams", beats.status().message());
      }
    }
    for (auto& queue : queues_) {
      (new AsyncSession(core_.get(), &service_, queue.get()))->Request();
      queue_threads_.emplace_back([q = queue.get()] {
        void* tag = nullptr;
        bool ok = false;
        while (q->Next(&tag, &ok)) Call::Handle(tag, ok);
      });
    }
    StatusCall::Await(core_.get(), &service_, queues_[0].get(), kStatusMethod);
    StacksCall::Await(core_.get(), &service_, queues_[0].get(), kStacksMethod);
    HealthCall::Await(core_.get(), &health_, queues_[0].get(), kHealthCheck);
    HealthWatch::Await(core_.get(), &health_, queues_[0].get());
    return Status::Ok();
  }

  // After the server's shutdown: each queue ends once its last tag is taken (a queue without
  // a thread, when the server never started, is drained here).
  // The server has cancelled every call (Shutdown); their last tags may still be on the way,
  // and a session's read failing then starts its Finish.
  void EndQueues() {
    if (!core_->WaitNoCalls(kCallsEndWithin)) {
      spdlog::warn("the rendezvous service stops with {} gRPC calls still open after {} s",
                   core_->CallsAlive(), kCallsEndWithin.count());
    }
    for (auto& queue : queues_) queue->Shutdown();
    for (auto& thread : queue_threads_) thread.join();
    queue_threads_.clear();
    if (server_) return;
    for (auto& queue : queues_) {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) {
      }
    }
  }

  // The /metrics endpoint, with the service's TLS when it has one.
  Status ServeMetrics() {
    const auto& o = core_->options;
    http::HttpServerOptions mo = *o.metrics;
    if (o.security.tls()) {
      mo.tls = http::TlsOptions{o.security.cert_pem, o.security.key_pem, o.security.ca_pem};
    }
    Core* core = core_.get();
    auto started = metrics::ServeMetrics(core_->io, mo, [core] { return core->registry.Render(); });
    if (!started.ok()) return started.status();
    core_->metrics_server = std::move(started).value();
    metrics_url_ = core_->metrics_server->url();
    return Status::Ok();
  }

  std::unique_ptr<Core> core_;
  ServiceBase service_;
  HealthService health_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::thread> queue_threads_;
  std::thread thread_;
  std::uint16_t port_ = 0;
  std::string metrics_url_;
  std::atomic<bool> stopped_{false};
};

}  // namespace

StatusOr<std::unique_ptr<RendezvousService>> RendezvousService::Start(
    const ServiceOptions& options) {
  auto service = std::make_unique<GrpcRendezvousService>(options);
  CRUN_RETURN_IF_ERROR(service->Init());
  return std::unique_ptr<RendezvousService>(std::move(service));
}

}  // namespace crun::rdzv
