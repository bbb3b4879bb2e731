// The gRPC front end of the rendezvous (grpc_service.h): the server, its completion queues and
// their threads, the engine's thread and its hooks, the metrics endpoint, and the stop. What
// its parts share: grpc_front.h; each agent's stream: grpc_sessions.cc; the unary calls:
// grpc_unary_calls.cc.
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
#include "rendezvous/goodput/ledger_json.h"
#include "rendezvous/goodput/timeline.h"
#include "rendezvous/service/beat_receiver.h"
#include "rendezvous/service/engine.h"
#include "rendezvous/service/engine_metrics.h"
#include "rendezvous/service/proto_messages.h"
#include "rendezvous/store_server/round_store.h"
#include "rendezvous/store_server/store_server.h"

#include "rendezvous/service/grpc_front.h"

namespace crun::rdzv {
namespace {

// The daemon's /goodput and /goodput.json: the job the query's run_id names (or the only one
// with ledgers), as a timeline or as the JSON --goodput-file holds.
http::HttpResponse GoodputPage(const Engine& engine, const std::string& query, bool json) {
  std::string run_id;
  if (query.rfind("run_id=", 0) == 0) run_id = query.substr(7, query.find('&') - 7);
  http::HttpResponse r;
  auto nodes = engine.Goodput(run_id, TimePoint::clock::now());
  if (nodes.empty()) {
    r.status = 404;
    r.body = run_id.empty() ? "no job to show: name one, /goodput?run_id=ID\n"
                            : "no goodput ledger of job " + run_id + " here\n";
    return r;
  }
  const goodput::JobLedger job = goodput::Combine(std::move(nodes));
  if (json) {
    r.content_type = "application/json";
    r.body = goodput::FileJson(job).dump(2) + "\n";
  } else {
    r.content_type = "text/html; charset=utf-8";
    r.body = goodput::RenderTimeline(job, run_id);
  }
  return r;
}

using namespace grpc_front;  // the front end's shared parts

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
      if (core->engine) core->engine->RefreshMetrics(TimePoint::clock::now());
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
      AwaitSession(core_.get(), &service_, queue.get());
      queue_threads_.emplace_back([q = queue.get()] {
        void* tag = nullptr;
        bool ok = false;
        while (q->Next(&tag, &ok)) Call::Handle(tag, ok);
      });
    }
    AwaitUnaryCalls(core_.get(), &service_, &health_, queues_[0].get());
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
    // The jobs' goodput (docs/observability.md): /goodput?run_id=ID, a timeline; .json, its
    // figures. On the engine's thread, as the metrics page is.
    for (const bool json : {false, true}) {
      pages_[json ? "/goodput.json" : "/goodput"] = [core, json](const std::string& query) {
        return GoodputPage(*core->engine, query, json);
      };
    }
    auto started = metrics::ServeMetrics(
        core_->io, mo, [core] { return core->registry.Render(); }, &pages_);
    if (!started.ok()) return started.status();
    core_->metrics_server = std::move(started).value();
    metrics_url_ = core_->metrics_server->url();
    return Status::Ok();
  }

  std::unique_ptr<Core> core_;
  metrics::Pages pages_;  // beside /metrics
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
