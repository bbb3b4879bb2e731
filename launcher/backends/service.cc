#include "launcher/backends/service.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string_view>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/service_rendezvous.h"
#include "agent/rendezvous/session_client.h"
#include "base/host_addresses.h"
#include "base/proc.h"
#include "base/socket.h"
#include "crun/v1/rendezvous.grpc.pb.h"
#include "launcher/plan.h"
#include "rendezvous/service/grpc_service.h"

namespace crun::launcher {
namespace {

// Asks the service at `target` for the status of `run_id` (empty: every job), within `timeout`.
// With `wait_for_ready`, gRPC keeps connecting until the deadline instead of failing at the
// first connection that breaks.
grpc::Status AskStatus(const std::string& target, const Security& security,
                       std::chrono::milliseconds timeout, const std::string& run_id,
                       v1::StatusResponse* resp, bool wait_for_ready = false) {
  agent::ChannelOptions co;
  co.security = security;
  auto stub = v1::Rendezvous::NewStub(agent::MakeChannel(target, co));
  grpc::ClientContext ctx;
  if (!security.token.empty()) ctx.AddMetadata(kTokenHeader, security.token);
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  ctx.set_wait_for_ready(wait_for_ready);
  v1::StatusRequest req;
  req.set_run_id(run_id);
  return stub->Status(&ctx, req, resp);
}

// Who answers on a port this node could not listen on.
enum class Holder {
  kCrun,    // crun's service answered
  kGone,    // nobody listens now: the holder let go
  kOther,   // proven not crun's service: it answered, and not as crun's service does
  kSilent,  // it accepts and says nothing yet: crun's service, stopped or slow, or a stranger
};
struct Probe {
  Holder holder = Holder::kOther;
  std::string answer;  // what it said, for a message
};

// What the first bytes a server sends back to an HTTP/2 client preface say of it: an HTTP/2
// frame (gRPC's server answers with its SETTINGS), a TLS record (a TLS server, which may be
// crun's with TLS), or something else (an HTTP/1 reply, a banner, garbage).
enum class FirstBytes { kHttp2, kTls, kOther };
FirstBytes Classify(std::string_view b) {
  if (b.size() >= 9 && b[3] == 0x04 && b.substr(5, 4) == std::string_view("\0\0\0\0", 4)) {
    return FirstBytes::kHttp2;  // a SETTINGS frame on stream 0
  }
  if (b.size() >= 2 && b[0] >= 0x14 && b[0] <= 0x17 && b[1] == 0x03) return FirstBytes::kTls;
  return FirstBytes::kOther;
}

// Whether one of the processes holding `port` could be crun's service: it is a crun, or it is
// stopped (SIGSTOP, a tracer: whatever it is, it cannot answer now), or none is visible
// (another user's, or another PID namespace's: nothing is proven then).
bool MaybeCrun(std::uint16_t port) {
  const std::vector<PortHolder> holders = TcpPortHolderList(port);
  return holders.empty() || std::any_of(holders.begin(), holders.end(), [](const PortHolder& h) {
           const std::optional<char> state = ProcessState(h.pid);
           return h.name == "crun" || state == 'T' || state == 't';
         });
}

// Connects to the endpoint and listens to what the holder says, for up to `wait`. In cleartext
// it is sent HTTP/2's client preface first, which crun's service answers with its SETTINGS;
// with TLS it is sent nothing (the job's service would wait for a ClientHello), so only a
// holder that speaks first or closes is told apart. Only a connection refused is "gone": a
// connection that times out (a stopped holder whose accept queue is full) is silent.
Probe ListenToHolder(const Endpoint& e, const Security& security, std::chrono::milliseconds wait) {
  auto fd = ConnectTcp(e.host, e.port, DeadlineAfter(std::chrono::milliseconds(500)));
  if (!fd.ok()) {
    if (fd.status().code() == StatusCode::kTimeout) return {Holder::kSilent, {}};
    return {Holder::kGone, fd.status().message()};
  }
  const std::string peer = "the holder of port " + std::to_string(e.port);
  const auto deadline = DeadlineAfter(wait);
  // A connection closed or reset unanswered: a stranger, unless a crun may hold the port (a
  // service shutting down resets what waited in its queue): then try again.
  const Probe closed = MaybeCrun(e.port)
                           ? Probe{Holder::kGone, "it closed the connection; a crun stopping?"}
                           : Probe{Holder::kOther, "it closed the connection without a word"};
  if (!security.tls()) {
    static constexpr std::string_view
        kPreface("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0", 33);
    if (!SendAll(fd->get(), kPreface, deadline, peer).ok()) return closed;
  }
  // A frame header is 9 bytes: read until there are that many, the holder closes or time is up.
  char buf[64];
  std::size_t n = 0;
  while (n < 9) {
    auto got = RecvSome(fd->get(), buf + n, 1, sizeof buf - n, deadline, peer);
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kTimeout) return {Holder::kSilent, {}};
      if (n == 0) return closed;
      break;  // it said a few bytes and closed: judged on those
    }
    n += *got;
  }
  const std::string_view said(buf, n);
  switch (Classify(said)) {
    case FirstBytes::kHttp2:
    case FirstBytes::kTls:
      return {Holder::kSilent, {}};  // a server of the right kind: ask it again, as gRPC
    case FirstBytes::kOther:
      break;
  }
  std::string shown;
  for (char c : said) shown += std::isprint(static_cast<unsigned char>(c)) ? c : '.';
  return {Holder::kOther, "it answered \"" + shown + "\", which is not HTTP/2"};
}

// Asks whatever holds the endpoint for the service's status. Any answer of crun's service (the
// status, an unknown job, a wrong token, stopping) is crun's; nothing listening is "gone" (the
// holder let go: try to host again). A holder is a stranger only when that is proven: it
// answers, and not as crun's service (bytes that are not HTTP/2, a gRPC server without crun's
// Status call); or, given the whole timeout, it said nothing while every process holding the
// port is visibly a running process that is not crun. A crun service that is stopped (SIGSTOP,
// a paused VM) or slow is silent: the caller waits for it within join_timeout. gRPC gives up on
// a connection that does not send its SETTINGS within 100 ms (rdzv::ChannelOptions::
// min_connect), so a slow service first fails here and is heard by listening to it directly.
Probe ProbeService(const Endpoint& e, const Security& security, std::chrono::milliseconds timeout,
                   bool wait_for_ready = false) {
  v1::StatusResponse resp;
  const grpc::Status s =
      AskStatus(FormatEndpoint(e.host, e.port), security, timeout, "", &resp, wait_for_ready);
  using grpc::StatusCode;
  switch (s.error_code()) {
    case StatusCode::OK:
    case StatusCode::NOT_FOUND:
    case StatusCode::UNAUTHENTICATED:
    case StatusCode::PERMISSION_DENIED:
      return {Holder::kCrun, {}};
    case StatusCode::UNIMPLEMENTED:
      return {Holder::kOther, s.error_message()};  // a gRPC server without crun's service
    default:
      break;
  }
  if (s.error_message() == "the service is stopping") return {Holder::kCrun, {}};
  // Unavailable, a deadline, or an error of the connection: nothing is proven yet.
  Probe heard = ListenToHolder(e, security, std::chrono::milliseconds(300));
  if (heard.holder != Holder::kSilent) return heard;
  // It speaks HTTP/2 or TLS, or nothing yet: give it the whole timeout to answer as gRPC.
  if (!wait_for_ready) return ProbeService(e, security, timeout, true);
  if (!MaybeCrun(e.port)) {
    return {Holder::kOther, "it accepted and said nothing for " + std::to_string(timeout.count()) +
                                " ms, and no process holding the port is a crun"};
  }
  return {Holder::kSilent, s.error_message()};
}

class ServiceRun final : public BackendRun {
 public:
  explicit ServiceRun(ServicePlan plan) : plan_(std::move(plan)) {}
  const ServicePlan& plan() const { return plan_; }

  StatusOr<std::unique_ptr<agent::Rendezvous>> Open(const LaunchPlan& p,
                                                    boost::asio::io_context& io,
                                                    const agent::AgentOptions& a) override {
    if (plan_.try_host) CRUN_RETURN_IF_ERROR(Host(p));
    return agent::MakeServiceRendezvous(io, Options(p, a));
  }

  void Close() override {
    if (!hosted_) return;
    // The other nodes were sent the outcome with ours: let their sessions end first.
    hosted_->Stop(close_timeout_);
    hosted_.reset();
  }

 private:
  agent::ServiceRendezvousOptions Options(const LaunchPlan& p, const agent::AgentOptions& a) const {
    const LaunchOptions& o = p.o;
    const RdzvConf& conf = p.values.rdzv_conf;
    agent::ServiceRendezvousOptions so;
    so.endpoint_host = plan_.endpoint.host;
    so.endpoint_port = plan_.endpoint.port;
    so.run_id = p.run_id;
    so.role = o.role;
    so.host = a.host_name;
    so.node_id = conf.node_id.empty() ? DefaultNodeId(so.host, plan_.endpoint) : conf.node_id;
    if (!o.local_addr.empty()) so.addresses.push_back(o.local_addr);
    so.nproc = p.nproc;
    if (p.node_rank_given) so.requested_rank = p.values.node_rank;
    so.settings = p.values.settings;
    so.heartbeat_interval = p.heartbeat_interval;
    so.keepalive_timeout =
        conf.read_timeout ? Millis(*conf.read_timeout) : p.values.settings.heartbeat_timeout;
    so.virtual_local_rank = o.virtual_local_rank;
    if (conf.reconnect_timeout) so.reconnect_timeout = Millis(*conf.reconnect_timeout);
    so.security = p.security;
    so.snapshot_facts = a.snapshot_facts;
    return so;
  }

  // Hosts the service on the endpoint's port, or joins the crun service that serves it
  // already. Whoever held the port may have let go since (a crun that ended): host it then.
  Status Host(const LaunchPlan& p) {
    const Endpoint& e = plan_.endpoint;
    crun::rdzv::ServiceOptions service;
    service.host = BindAddressFor(e.host);
    service.port = e.port;
    service.advertise_addr = p.o.local_addr;
    service.security = p.security;
    close_timeout_ = p.values.rdzv_conf.close_timeout ? Millis(*p.values.rdzv_conf.close_timeout)
                                                      : std::chrono::milliseconds(5000);
    Probe probe;
    for (int tries = 0; tries < 3; ++tries) {
      auto started = crun::rdzv::RendezvousService::Start(service);
      if (started.ok()) {
        Hosting(p, std::move(started).value());
        return Status::Ok();
      }
      if (p.values.rdzv_conf.is_host.value_or(false)) {
        return Status(started.status().code(), "is_host=1 but " + started.status().message());
      }
      if (started.status().code() != StatusCode::kUnavailable) {
        // Not "in use": nobody else serves it either, and joining would only wait for nothing.
        return Status(started.status().code(), "cannot host the rendezvous service of " +
                                                   p.o.rdzv_endpoint + ": " +
                                                   started.status().message());
      }
      probe = ProbeService(e, p.security, kProbeTimeout);
      if (probe.holder == Holder::kCrun) {
        spdlog::info("port {} is served already (another crun or `crun rendezvous`): joining it",
                     e.port);
        return Status::Ok();
      }
      if (probe.holder == Holder::kSilent) return JoinSilent(p, probe);
      if (probe.holder == Holder::kOther) break;
      spdlog::info("port {} was in use, but nobody serves it now ({}): hosting again", e.port,
                   probe.answer);
    }
    // kOther, or in use at every try while nobody serves it (bound and not listening).
    const std::string holders = TcpPortHolders(e.port);
    const std::string what = probe.holder == Holder::kGone
                                 ? ", which does not serve it ("
                                 : ", which is not a crun rendezvous service (";
    return Unavailable("port " + std::to_string(e.port) + " of --rdzv-endpoint " +
                       p.o.rdzv_endpoint + " is held by " +
                       (holders.empty() ? std::string("a process crun cannot see") : holders) +
                       what + probe.answer + "): stop it or choose another port");
  }

  // Proven neither crun's nor a stranger: a crun service stopped for a moment (a loaded machine,
  // a paused VM) is joined and waited for like one that is not up yet, within join_timeout.
  Status JoinSilent(const LaunchPlan& p, const Probe& probe) const {
    const Endpoint& e = plan_.endpoint;
    const std::string holders = TcpPortHolders(e.port);
    spdlog::warn(
        "port {} of --rdzv-endpoint {} is held by {}, which does not answer yet ({}): joining "
        "it as the rendezvous service, waiting for it up to join_timeout ({} ms)",
        e.port, p.o.rdzv_endpoint, holders.empty() ? "a process crun cannot see" : holders,
        probe.answer.empty() ? "no word" : probe.answer, p.values.settings.join_timeout.count());
    return Status::Ok();
  }

  void Hosting(const LaunchPlan& p, std::unique_ptr<crun::rdzv::RendezvousService> service) {
    const Endpoint& e = plan_.endpoint;
    hosted_ = std::move(service);
    spdlog::info("hosting the rendezvous service on port {}", e.port);
    if (p.security.token.empty() && !crun::LoopbackOnly(e.host)) {
      spdlog::warn(
          "the rendezvous service on port {} has no job token: anyone who can "
          "reach it can join or end this job (set CRUN_TOKEN_FILE or CRUN_TOKEN on "
          "every node; docs/security.md)",
          e.port);
    }
  }

  static constexpr std::chrono::milliseconds kProbeTimeout{3000};

  ServicePlan plan_;
  std::unique_ptr<crun::rdzv::RendezvousService> hosted_;
  std::chrono::milliseconds close_timeout_{5000};
};

// Whether this node hosts the service: its endpoint names this host, or is_host says so; not
// without a certificate when the job uses TLS.
StatusOr<bool> TryHost(const LaunchPlan& p, const Endpoint& endpoint) {
  const RdzvConf& conf = p.values.rdzv_conf;
  const bool host = conf.is_host.value_or(NamesThisHost(endpoint.host));
  if (!host || !p.security.tls() || !p.security.cert_pem.empty()) return host;
  if (conf.is_host.value_or(false)) {
    return InvalidArgument("is_host=1 with TLS: hosting the rendezvous service (" +
                           p.o.rdzv_endpoint +
                           ") needs its certificate and key (--tls-cert, --tls-key)");
  }
  return false;  // a TLS client on the service's own host (a `crun rendezvous` daemon there)
}

StatusOr<std::unique_ptr<BackendRun>> Plan(LaunchPlan& p, const PlanInputs& in) {
  const LaunchOptions& o = in.o;
  if (o.rdzv_endpoint.empty()) {
    return InvalidArgument("--rdzv-backend " + o.rdzv_backend +
                           " needs --rdzv-endpoint host[:port]");
  }
  ServicePlan s;
  auto endpoint = ParseEndpoint(o.rdzv_endpoint, 29400);
  if (!endpoint.ok()) return InvalidArgument("--rdzv-endpoint: " + endpoint.status().message());
  s.endpoint = *endpoint;
  if (Status st = CheckResolvable(s.endpoint.host); !st.ok()) {
    return InvalidArgument("--rdzv-endpoint: " + st.message());
  }
  // The step's first node hosts the rendezvous, whatever its name resolves to.
  if (p.slurm && !p.values.rdzv_conf.is_host) p.values.rdzv_conf.is_host = p.slurm->is_host;
  if (p.slurm && p.values.rdzv_conf.node_id.empty())
    p.values.rdzv_conf.node_id = p.slurm->node_name;
  CRUN_ASSIGN_OR_RETURN(p.security, LoadSecurity(o.security, "client"));
  CRUN_RETURN_IF_ERROR(PlanDynamicSettings(p));
  CRUN_ASSIGN_OR_RETURN(s.try_host, TryHost(p, s.endpoint));
  p.run_id = DynamicRunId(o);
  return std::unique_ptr<BackendRun>(std::make_unique<ServiceRun>(std::move(s)));
}

// `crun status`: the jobs of crun's rendezvous service. *final: the service answered no (a
// wrong token): asking again will not help.
int FetchServiceStatus(const StatusQuery& q, v1::StatusResponse* resp, std::string* where,
                       bool* final) {
  auto parsed = crun::ParseEndpoint(q.endpoint, 29400);
  if (!parsed.ok()) {
    std::fprintf(stderr, "crun status: --rdzv-endpoint: %s\n", parsed.status().message().c_str());
    return 2;
  }
  const crun::Endpoint& e = *parsed;
  auto security = crun::LoadSecurity(q.security, "client");
  if (!security.ok()) {
    std::fprintf(stderr, "crun status: %s\n", security.status().message().c_str());
    return 2;
  }
  const std::string target = crun::FormatEndpoint(e.host, e.port);
  *where = target;
  const auto timeout = std::chrono::milliseconds(static_cast<long>(q.timeout * 1000));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto s = AskStatus(target, *security, timeout, q.run_id, resp);
  if (rdzv::GaveUpConnecting(s)) {  // a daemon too busy to finish a handshake at once: wait for it
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() > 0) {
      const grpc::Status again = AskStatus(target, *security, left, q.run_id, resp, true);
      if (again.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) s = again;
    }
  }
  if (s.ok()) return 0;
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    *final = true;
    std::fprintf(stderr, "crun status: the rendezvous service at %s refused the request: %s\n",
                 target.c_str(), s.error_message().c_str());
    return 1;
  }
  std::fprintf(stderr, "crun status: no answer from the rendezvous service at %s: %s\n",
               target.c_str(), s.error_message().c_str());
  return 1;
}

}  // namespace

Backend ServiceBackend() {
  Backend b;
  b.name = "crun";
  b.by_default = Backend::Default::kWithEndpoint;
  b.meets_at_endpoint = true;
  b.leaves_nodes_out = true;
  b.aliases = {"c10d"};
  b.help = "the rendezvous service at --rdzv-endpoint (hosted by the node it names)";
  b.plan = Plan;
  b.status = FetchServiceStatus;
  b.status_help = "a rendezvous service";
  b.endpoint_help = "host[:port] (port 29400)";
  return b;
}

const ServicePlan* ServicePlanOf(const LaunchPlan& plan) {
  const auto* run = dynamic_cast<const ServiceRun*>(plan.rendezvous.get());
  return run == nullptr ? nullptr : &run->plan();
}

}  // namespace crun::launcher
