#include "launcher/backends/service.h"

#include <cstdio>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/service_rendezvous.h"
#include "agent/rendezvous/session_client.h"
#include "base/host_addresses.h"
#include "base/proc.h"
#include "base/socket.h"
#include "crun/v1/rendezvous.grpc.pb.h"
#include "launcher/launch_plan.h"
#include "rendezvous/service/grpc_service.h"

namespace crun::launcher {
namespace {

// Asks the service at `target` for the status of `run_id` (empty: every job), within `timeout`.
grpc::Status AskStatus(const std::string& target, const Security& security,
                       std::chrono::milliseconds timeout, const std::string& run_id,
                       v1::StatusResponse* resp) {
  agent::ChannelOptions co;
  co.security = security;
  auto stub = v1::Rendezvous::NewStub(agent::MakeChannel(target, co));
  grpc::ClientContext ctx;
  if (!security.token.empty()) ctx.AddMetadata(kTokenHeader, security.token);
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::StatusRequest req;
  req.set_run_id(run_id);
  return stub->Status(&ctx, req, resp);
}

// Who answers on a port this node could not listen on.
enum class Holder { kCrun, kGone, kOther };
struct Probe {
  Holder holder = Holder::kOther;
  std::string answer;  // what it said, for a message
};

// Asks whatever holds the endpoint for the service's status, within `timeout`. Any answer of
// crun's service (the status, an unknown job, a wrong token, stopping) is crun's; nothing
// listening is "gone" (the holder let go: try to host again); anything else, a server that is
// not crun's (another gRPC service, a process that accepts and says nothing, garbage).
Probe ProbeService(const Endpoint& e, const Security& security, std::chrono::milliseconds timeout) {
  v1::StatusResponse resp;
  const grpc::Status s = AskStatus(FormatEndpoint(e.host, e.port), security, timeout, "", &resp);
  using grpc::StatusCode;
  switch (s.error_code()) {
    case StatusCode::OK:
    case StatusCode::NOT_FOUND:
    case StatusCode::UNAUTHENTICATED:
    case StatusCode::PERMISSION_DENIED:
      return {Holder::kCrun, {}};
    case StatusCode::UNAVAILABLE: {
      if (s.error_message() == "the service is stopping") return {Holder::kCrun, {}};
      auto fd = ConnectTcp(e.host, e.port, DeadlineAfter(std::chrono::milliseconds(500)));
      if (!fd.ok()) return {Holder::kGone, fd.status().message()};
      return {Holder::kOther, s.error_message()};
    }
    default:
      return {Holder::kOther, s.error_message()};
  }
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
    const RdzvConf& conf = p.conf;
    agent::ServiceRendezvousOptions so;
    so.endpoint_host = plan_.endpoint.host;
    so.endpoint_port = plan_.endpoint.port;
    so.run_id = p.run_id;
    so.role = o.role;
    so.host = a.host_name;
    so.node_id = conf.node_id.empty() ? DefaultNodeId(so.host, plan_.endpoint) : conf.node_id;
    if (!o.local_addr.empty()) so.addresses.push_back(o.local_addr);
    so.nproc = p.nproc;
    if (p.node_rank_given) so.requested_rank = p.node_rank;
    so.settings = p.settings;
    so.heartbeat_interval = p.heartbeat_interval;
    so.keepalive_timeout =
        conf.read_timeout ? Millis(*conf.read_timeout) : p.settings.heartbeat_timeout;
    so.virtual_local_rank = o.virtual_local_rank;
    if (conf.reconnect_timeout) so.reconnect_timeout = Millis(*conf.reconnect_timeout);
    so.security = p.security;
    so.snapshot_facts = a.snapshot_facts;
    so.stragglers = a.straggler_exchange;
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
    close_timeout_ =
        p.conf.close_timeout ? Millis(*p.conf.close_timeout) : std::chrono::milliseconds(5000);
    Probe probe;
    for (int tries = 0; tries < 3; ++tries) {
      auto started = crun::rdzv::RendezvousService::Start(service);
      if (started.ok()) {
        Hosting(p, std::move(started).value());
        return Status::Ok();
      }
      if (p.conf.is_host.value_or(false)) {
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
      if (probe.holder == Holder::kOther) break;
      spdlog::info("port {} was in use, but nobody serves it now ({}): hosting again", e.port,
                   probe.answer);
    }
    const std::string holders = TcpPortHolders(e.port);
    return Unavailable("port " + std::to_string(e.port) + " of --rdzv-endpoint " +
                       p.o.rdzv_endpoint + " is held by " +
                       (holders.empty() ? std::string("a process crun cannot see") : holders) +
                       ", which is not a crun rendezvous service (" + probe.answer +
                       "): stop it or choose another port");
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
  const RdzvConf& conf = p.conf;
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
  if (p.slurm && !p.conf.is_host) p.conf.is_host = p.slurm->is_host;
  if (p.slurm && p.conf.node_id.empty()) p.conf.node_id = p.slurm->node_name;
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
  auto s =
      AskStatus(target, *security, std::chrono::milliseconds(static_cast<long>(q.timeout * 1000)),
                q.run_id, resp);
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
  b.leaves_nodes_out = true;
  b.aliases = {"c10d"};
  b.help = "the rendezvous service at --rdzv-endpoint (hosted by the node it names)";
  b.plan = Plan;
  b.status = FetchServiceStatus;
  return b;
}

const ServicePlan* ServicePlanOf(const LaunchPlan& plan) {
  const auto* run = dynamic_cast<const ServiceRun*>(plan.rendezvous.get());
  return run == nullptr ? nullptr : &run->plan();
}

}  // namespace crun::launcher
