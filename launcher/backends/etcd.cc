#include "launcher/backends/etcd.h"

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <map>

#include "agent/rendezvous/etcd_rendezvous.h"
#include "base/host_addresses.h"
#include "base/numbers.h"
#include "crun/v1/rendezvous.pb.h"
#include "launcher/plan.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/job.h"
#include "rendezvous/service/proto_messages.h"

namespace crun::launcher {
namespace {

constexpr long long kMaxRetentionSeconds = 366LL * 24 * 3600;

class EtcdRun final : public BackendRun {
 public:
  explicit EtcdRun(EtcdPlan plan) : plan_(std::move(plan)) {}
  const EtcdPlan& plan() const { return plan_; }

  StatusOr<std::unique_ptr<agent::Rendezvous>> Open(const LaunchPlan& p,
                                                    boost::asio::io_context& io,
                                                    const agent::AgentOptions& a) override {
    const LaunchOptions& o = p.o;
    const RdzvConf& conf = p.values.rdzv_conf;
    agent::EtcdRendezvousOptions eo;
    for (const auto& e : plan_.endpoints) eo.endpoints.push_back(e.ToString());
    if (!plan_.prefix.empty()) eo.root = plan_.prefix;
    eo.run_id = p.run_id;
    eo.role = o.role;
    eo.host = a.host_name;
    const Endpoint& first = plan_.endpoints.front();
    eo.node_id = conf.node_id.empty() ? DefaultNodeId(eo.host, first) : conf.node_id;
    // This node's address toward etcd is the one its peers reach it on (as toward the service).
    const std::string toward =
        o.local_addr.empty() ? LocalAddressToward(first.host, first.port) : o.local_addr;
    if (!toward.empty()) eo.addresses.push_back(toward);
    eo.advertise_addr =
        toward.empty() || (LoopbackOnly(toward) && !LoopbackOnly(first.host)) ? eo.host : toward;
    eo.nproc = p.nproc;
    if (p.node_rank_given) eo.requested_rank = p.values.node_rank;
    eo.settings = p.values.settings;
    eo.security = p.security;
    eo.user = plan_.user;
    eo.password = plan_.password;
    if (conf.connect_timeout) eo.connect_timeout = Millis(*conf.connect_timeout);
    if (conf.reconnect_timeout) eo.outage_timeout = Millis(*conf.reconnect_timeout);
    eo.virtual_local_rank = o.virtual_local_rank;
    eo.straggler_settings = a.stragglers;
    eo.retention = plan_.retention;
    return agent::MakeEtcdRendezvous(io, eo);
  }

 private:
  EtcdPlan plan_;
};

// "h1:2379,h2:2379": etcd's members, each resolvable.
StatusOr<std::vector<Endpoint>> ParseMembers(const std::string& list, const std::string& flag) {
  std::vector<Endpoint> out;
  for (std::size_t start = 0; start <= list.size();) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    auto endpoint = ParseEndpoint(list.substr(start, comma - start), 2379);
    start = comma + 1;
    if (!endpoint.ok()) {
      return InvalidArgument(flag + " '" + list + "': " + endpoint.status().message());
    }
    out.push_back(*endpoint);
  }
  return out;
}

// etcd_user and etcd_password_file: the password is the file's first line, never argv.
Status PlanCredentials(EtcdPlan& e, const std::map<std::string, std::string>& keys) {
  const auto at = [&](const char* k) {
    auto it = keys.find(k);
    return it == keys.end() ? std::string() : it->second;
  };
  e.user = at("etcd_user");
  const std::string file = at("etcd_password_file");
  if (!file.empty() && e.user.empty()) {
    return InvalidArgument("--rdzv-conf etcd_password_file needs etcd_user");
  }
  if (e.user.empty()) return Status::Ok();
  if (file.empty()) {
    return InvalidArgument("--rdzv-conf etcd_user=" + e.user +
                           " needs etcd_password_file=PATH (a password is never taken "
                           "from the command line)");
  }
  std::ifstream in(file);
  if (!in) {
    return PosixError("--rdzv-conf etcd_password_file=" + file, errno,
                      StatusCode::kInvalidArgument);
  }
  std::getline(in, e.password);
  if (e.password.empty()) {
    return InvalidArgument("--rdzv-conf etcd_password_file=" + file +
                           ": the first line (the password) is empty");
  }
  return Status::Ok();
}

// etcd's members, TLS to them, etcd's user and password, and the rendezvous settings (kept in
// etcd; every agent of the run must give the same).
StatusOr<std::unique_ptr<BackendRun>> Plan(LaunchPlan& p, const PlanInputs& in) {
  const LaunchOptions& o = in.o;
  if (o.rdzv_endpoint.empty()) {
    return InvalidArgument("--rdzv-backend " + o.rdzv_backend +
                           " needs --rdzv-endpoint with etcd's members: h1:2379,h2:2379,...");
  }
  EtcdPlan e;
  CRUN_ASSIGN_OR_RETURN(e.endpoints, ParseMembers(o.rdzv_endpoint, "--rdzv-endpoint"));
  for (const Endpoint& member : e.endpoints) {
    if (Status s = CheckResolvable(member.host); !s.ok()) {
      return InvalidArgument("--rdzv-endpoint: " + s.message());
    }
  }
  if (in.given.count("--token-file")) {
    return InvalidArgument(
        "--token-file secures crun's rendezvous service; etcd checks its own users: "
        "--rdzv-conf etcd_user=NAME,etcd_password_file=PATH (and --tls-ca, --tls-cert, "
        "--tls-key for TLS)");
  }
  if (p.values.rdzv_conf.is_host) {
    p.notes.push_back("--rdzv-conf is_host: ignored with etcd-v3 (no node hosts the rendezvous)");
  }
  if (p.slurm && p.values.rdzv_conf.node_id.empty())
    p.values.rdzv_conf.node_id = p.slurm->node_name;
  CRUN_ASSIGN_OR_RETURN(p.security, LoadSecurity(o.security, "client"));
  p.security.token.clear();  // CRUN_TOKEN is the service's, not etcd's
  if (auto prefix = p.values.rdzv_conf.backend_keys.find("etcd_prefix");
      prefix != p.values.rdzv_conf.backend_keys.end()) {
    if (prefix->second.front() != '/') {
      return InvalidArgument("--rdzv-conf: etcd_prefix='" + prefix->second +
                             "' must start with '/'");
    }
    e.prefix = prefix->second;
  }
  if (auto r = p.values.rdzv_conf.backend_keys.find("etcd_retention");
      r != p.values.rdzv_conf.backend_keys.end()) {
    const auto seconds = ParseInteger(r->second, 0, kMaxRetentionSeconds);
    if (!seconds) {
      return InvalidArgument("--rdzv-conf: etcd_retention='" + r->second +
                             "' is not a whole number of seconds from 0 (keep a finished job's "
                             "keys until removed by hand) to " +
                             std::to_string(kMaxRetentionSeconds) + " (a year)");
    }
    e.retention = std::chrono::seconds(*seconds);
  }
  CRUN_RETURN_IF_ERROR(PlanCredentials(e, p.values.rdzv_conf.backend_keys));
  CRUN_RETURN_IF_ERROR(PlanDynamicSettings(p));
  p.run_id = DynamicRunId(o);
  return std::unique_ptr<BackendRun>(std::make_unique<EtcdRun>(std::move(e)));
}

// Prints "crun status: <message>" and gives the exit code.
int Say(int code, const std::string& message) {
  std::fprintf(stderr, "crun status: %s\n", message.c_str());
  return code;
}

// `crun status`: the jobs kept in etcd under --etcd-prefix (one run id, or every one there).
// Liveness is each node's lease: a member listed is alive now.
int FetchStatus(const StatusQuery& q, v1::StatusResponse* resp, std::string* where, bool*) {
  etcd::ClientOptions co;
  auto members = ParseMembers(q.endpoint, "--rdzv-endpoint");
  if (!members.ok()) return Say(2, members.status().message());
  for (const auto& m : *members) co.endpoints.push_back(m.ToString());
  auto security = crun::LoadSecurity(q.security, "client");
  if (!security.ok()) return Say(2, security.status().message());
  co.security = *security;
  const auto flag = [&q](const char* name) {
    const auto it = q.flags.find(name);
    return it == q.flags.end() ? std::string() : it->second;
  };
  const std::string user = flag("--etcd-user"), password_file = flag("--etcd-password-file");
  if (!user.empty()) {
    std::ifstream in(password_file);
    if (password_file.empty() || !in || !std::getline(in, co.password)) {
      return Say(2,
                 "--etcd-user needs --etcd-password-file with the password on its first line ('" +
                     password_file + "' cannot be read)");
    }
    co.user = user;
  }
  std::string root = flag("--etcd-prefix");
  if (root.empty()) root = etcd::kDefaultRoot;
  *where = "etcd at " + q.endpoint + " under " + root;
  const auto deadline =
      etcd::Clock::now() + std::chrono::milliseconds(static_cast<long>(q.timeout * 1000));
  auto client = etcd::Client::Connect(co, deadline);
  if (!client.ok()) return Say(1, client.status().message());
  while (!root.empty() && root.back() == '/') root.pop_back();
  const std::string scope = q.run_id.empty() ? root + "/" : etcd::Keys(root, q.run_id).prefix;
  auto all = (*client)->GetPrefix(scope, deadline);
  if (!all.ok()) return Say(1, all.status().message());
  std::map<std::string, etcd::Mirror> runs;  // run id -> its keys
  for (auto& kv : all->kvs) {
    const std::string rest = kv.key.substr(root.size() + 1);
    const auto slash = rest.find('/');
    if (slash != std::string::npos) runs[rest.substr(0, slash)][kv.key] = std::move(kv);
  }
  const auto now = rdzv::TimePoint::clock::now();
  for (const auto& [run_id, mirror] : runs) {
    etcd::Keys keys(root, run_id);
    if (mirror.count(keys.state()) == 0) continue;
    auto job = etcd::StatusOf(keys, run_id, mirror, now, etcd::WallClock::now());
    if (!job.ok()) return Say(1, "run '" + run_id + "': " + job.status().message());
    for (auto& n : job->nodes) n.last_heartbeat_ms_ago = 0;
    rdzv::msg::StatusResponse one;
    one.jobs.push_back(std::move(job).value());
    const v1::StatusResponse proto = rdzv::ToProto(one);
    for (const auto& j : proto.jobs()) *resp->add_jobs() = j;
  }
  return 0;
}

}  // namespace

Backend EtcdBackend() {
  Backend b;
  b.name = "etcd-v3";
  b.meets_at_endpoint = true;
  b.leaves_nodes_out = true;
  b.aliases = {"etcd"};
  b.help = "etcd's v3 API at --rdzv-endpoint h1:2379,h2:2379,...";
  b.conf_keys = {"etcd_prefix", "etcd_user", "etcd_password_file", "etcd_retention"};
  b.conf_help = "etcd_prefix, etcd_user, etcd_password_file, etcd_retention";
  b.plan = Plan;
  b.status = FetchStatus;
  b.status_help = "jobs kept in etcd";
  b.endpoint_help = "etcd's members h1:2379,h2:2379,...";
  b.status_flags = {{"--etcd-prefix", "etcd-v3: the prefix of crun's keys",
                     std::string(etcd::kDefaultRoot)},
                    {"--etcd-user", "etcd-v3: etcd's user", ""},
                    {"--etcd-password-file",
                     "etcd-v3: file whose first line is the user's password", ""}};
  return b;
}

Backend EtcdV2Refused() {
  Backend b;
  b.name = "etcd-v2";
  b.refusal =
      "etcd's v2 API is gone from etcd 3.6 and crun does not speak it; --rdzv-backend etcd-v3 "
      "uses the same etcd through its v3 API";
  return b;
}

const EtcdPlan* EtcdPlanOf(const LaunchPlan& plan) {
  const auto* run = dynamic_cast<const EtcdRun*>(plan.rendezvous.get());
  return run == nullptr ? nullptr : &run->plan();
}

}  // namespace crun::launcher
