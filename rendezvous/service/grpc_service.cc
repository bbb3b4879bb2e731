#include "rendezvous/service/grpc_service.h"

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "base/endpoint.h"
#include "base/log_sampling.h"
#include "base/socket.h"
#include "base/write_queue.h"
#include "crun/v1/rendezvous.grpc.pb.h"
#include "metrics/endpoint.h"
#include "metrics/registry.h"
#include "rendezvous/service/engine.h"
#include "rendezvous/service/engine_metrics.h"
#include "rendezvous/service/proto_messages.h"
#include "rendezvous/store_server/round_store.h"
#include "rendezvous/store_server/store_server.h"

namespace crun::rdzv {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

class SessionReactor;

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
  // Messages from the gRPC threads queue in the inbox; the engine's thread is woken only when
  // it was empty, and then takes everything that arrived meanwhile in one turn (under load, one
  // wake-up serves many agents). Each message keeps the time it arrived.
  // A stream's end goes the same way, so it is never handled before its last message.
  // Converted here, on the gRPC thread; a message of no kind the service knows is dropped.
  void Received(SessionId id, const v1::AgentMessage& m, const std::string& peer_ip) {
    auto message = FromProto(m);
    if (!message) return;
    std::string peer = m.has_join() ? peer_ip : std::string();
    Queue({id, std::move(*message), Clock::now(), false, std::move(peer)});
  }
  void Closed(SessionId id) { Queue({id, {}, Clock::now(), true, {}}); }
  // OK when the call carries the job token (or none is needed); else the refusal, logged.
  grpc::Status Authorize(const grpc::CallbackServerContext* context, const char* call);
  // Keeps one timer on the engine's next deadline.
  void Rearm() {
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
  void Queue(Arrival a) {
    bool wake = false;
    {
      std::lock_guard lock(inbox_mu);
      wake = inbox.empty();
      inbox.push_back(std::move(a));
    }
    if (wake) asio::post(io, [this] { DrainInbox(); });
  }
  void DrainInbox() {
    std::vector<Arrival> batch;
    {
      std::lock_guard lock(inbox_mu);
      batch.swap(inbox);
    }
    if (!engine) return;
    for (auto& a : batch) {
      if (a.closed) {
        engine->OnSessionClosed(a.session, a.at);
      } else {
        engine->OnMessage(a.session, a.message, a.at, a.peer_ip);
      }
    }
    Rearm();
  }
  std::mutex inbox_mu;
  std::vector<Arrival> inbox;
  // Stacks calls waiting for the engine's answer (the engine's thread only).
  struct StacksCall {
    grpc::ServerUnaryReactor* reactor;
    v1::StacksResult* response;
  };
  std::unordered_map<std::uint64_t, StacksCall> stacks_calls;
  std::uint64_t next_stacks_call = 1;
  bool stopping = false;  // no more Stacks calls are taken
  void EndStacksCalls() {
    stopping = true;
    for (auto& [query, call] : stacks_calls) {
      call.reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the service is stopping"));
    }
    stacks_calls.clear();
  }
  std::mutex mu;
  std::unordered_map<SessionId, SessionReactor*> streams;
  std::atomic<std::uint64_t> refused_calls{0};
  // Prometheus metrics (options.metrics): counted on any thread, the page rendered on the
  // engine's.
  metrics::Registry registry;
  std::unique_ptr<EngineMetrics> engine_metrics;
  std::unique_ptr<http::HttpServer> metrics_server;
};

grpc::Status Core::Authorize(const grpc::CallbackServerContext* context, const char* call) {
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

// A session refused before it started: ends at once with the refusal.
class RefusedSession final : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ServiceMessage> {
 public:
  explicit RefusedSession(const grpc::Status& s) { Finish(s); }
  void OnDone() override { delete this; }
};

class SessionReactor final : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ServiceMessage> {
 public:
  SessionReactor(Core* core, std::string peer_ip)
      : core_(core), id_(core->next_session++), peer_ip_(std::move(peer_ip)) {
    {
      std::lock_guard lock(core_->mu);
      core_->streams[id_] = this;
    }
    // At once, before any message: the agent then knows its session was open, so that losing
    // it is a lost service in every phase, gathering too (reconnect_timeout bounds the wait).
    StartSendInitialMetadata();
    StartRead(&in_);
  }

  void Send(const v1::ServiceMessage& m) {
    if (const auto* next = writes_.Push(m)) StartWrite(next);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the agent closed its side, or the stream broke
      ReportClosed();
      finishing_ = true;
      if (writes_.Close()) FinishOnce();
      return;
    }
    core_->Received(id_, in_, peer_ip_);
    in_.Clear();
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) writes_.Close();
    if (const auto* next = writes_.Done()) {
      StartWrite(next);
    } else if (finishing_) {
      FinishOnce();
    }
  }

  void OnCancel() override {
    ReportClosed();
    finishing_ = true;
    if (writes_.Close()) FinishOnce();
  }

  void OnDone() override {
    {
      std::lock_guard lock(core_->mu);
      core_->streams.erase(id_);
    }
    ReportClosed();
    delete this;
  }

 private:
  void ReportClosed() {
    if (!closed_reported_.exchange(true)) core_->Closed(id_);
  }
  void FinishOnce() {
    if (!finished_.exchange(true)) Finish(grpc::Status::OK);
  }

  Core* core_;
  SessionId id_;
  std::string peer_ip_;
  v1::AgentMessage in_;
  WriteQueue<v1::ServiceMessage> writes_;
  std::atomic<bool> finishing_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> closed_reported_{false};
};

void Core::SendTo(SessionId id, const msg::ServiceMessage& m) {
  const v1::ServiceMessage wire = ToProto(m);
  std::lock_guard lock(mu);
  if (auto it = streams.find(id); it != streams.end()) it->second->Send(wire);
}

class ServiceImpl final : public v1::Rendezvous::CallbackService {
 public:
  explicit ServiceImpl(Core* core) : core_(core) {}

  grpc::ServerBidiReactor<v1::AgentMessage, v1::ServiceMessage>* Session(
      grpc::CallbackServerContext* context) override {
    if (core_->engine_metrics) core_->engine_metrics->sessions_total.With().Inc();
    if (auto s = core_->Authorize(context, "Session"); !s.ok()) return new RefusedSession(s);
    return new SessionReactor(core_, PeerIp(context->peer()));
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::StatusRequest* request,
                                   v1::StatusResponse* response) override {
    auto* reactor = context->DefaultReactor();
    if (auto s = core_->Authorize(context, "Status"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
    asio::post(core_->io, [this, reactor, request, response] {
      if (core_->engine)
        *response = ToProto(core_->engine->Status(request->run_id(), Clock::now()));
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* Stacks(grpc::CallbackServerContext* context,
                                   const v1::StacksQuery* request,
                                   v1::StacksResult* response) override {
    auto* reactor = context->DefaultReactor();
    if (auto s = core_->Authorize(context, "Stacks"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
    asio::post(core_->io, [this, reactor, request, response] {
      if (!core_->engine || core_->stopping) {
        return reactor->Finish(
            grpc::Status(grpc::StatusCode::UNAVAILABLE, "the service is stopping"));
      }
      const std::uint64_t query = core_->next_stacks_call++;
      core_->stacks_calls[query] = {reactor, response};
      const auto asked = core_->engine->AskStacks(request->run_id(), query,
                                                  Millis(request->timeout_ms()), Clock::now());
      if (!asked.ok()) {
        core_->stacks_calls.erase(query);
        reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, asked.message()));
      }
      core_->Rearm();
    });
    return reactor;
  }

 private:
  Core* core_;
};

class GrpcRendezvousService final : public RendezvousService {
 public:
  explicit GrpcRendezvousService(const ServiceOptions& options)
      : core_(std::make_unique<Core>(options)), service_(core_.get()) {}
  ~GrpcRendezvousService() override { Stop(std::chrono::milliseconds(200)); }

  // The engine, then the gRPC server, then the metrics endpoint, then the engine's thread.
  Status Init() {
    core_->engine = std::make_unique<Engine>(Hooks(), EngineOptionsFor());
    CRUN_RETURN_IF_ERROR(Listen());
    if (core_->options.metrics) {
      if (Status s = ServeMetrics(); !s.ok()) {
        server_->Shutdown();
        server_->Wait();
        server_.reset();
        return s;
      }
    }
    if (auto* health = server_->GetHealthCheckService()) {
      health->SetServingStatus("crun.v1.Rendezvous", true);
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
    if (server_) {
      // Sessions still open after the grace are cancelled; a Status call in flight completes
      // (the engine's thread keeps running until below).
      server_->Shutdown(std::chrono::system_clock::now() + grace);
      server_->Wait();
    }
    if (thread_.joinable()) {
      asio::post(core_->io, [this] {
        core_->timer.cancel();
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
      *it->second.response = ToProto(result);
      it->second.reactor->Finish(grpc::Status::OK);
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
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    const std::string address = FormatEndpoint(o.host, o.port);
    int selected = 0;
    builder.AddListeningPort(address, ServerCredentials(o.security), &selected);
    builder.RegisterService(&service_);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a second daemon must fail
    // Agents ping to notice a dead service quickly; let them.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 200);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    server_ = builder.BuildAndStart();
    if (!server_ || selected == 0) {
      server_.reset();
      return Unavailable("cannot listen on " + address +
                         " (address in use, not an address of this host, or no permission)");
    }
    port_ = static_cast<std::uint16_t>(selected);
    return Status::Ok();
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
  ServiceImpl service_;
  std::unique_ptr<grpc::Server> server_;
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
