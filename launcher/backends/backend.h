// The rendezvous backends, as one table: each entry has its --rdzv-backend name and aliases,
// its own --rdzv-conf keys, how to plan it and (through the BackendRun its plan returns) how to
// build its Rendezvous; `crun status` asks an entry that can be asked. PlanLaunch chooses the
// entry and hands it the plan; RunLaunch opens what it planned. Neither names a backend.
//
// Adding one (say, a Kubernetes lease): a file here with a function returning its Backend, and
// one line in DefaultBackends() (backends.cc). Tests register a test-only one the same way.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/agent_options.h"
#include "agent/rendezvous/rendezvous.h"
#include "base/endpoint.h"
#include "base/security.h"
#include "base/status.h"
#include "launcher/plan.h"

namespace CLI {
class App;
}
namespace crun::v1 {
class StatusResponse;
}

namespace crun::launcher {

// What a backend's plan acts on: the rendezvous of one crun, decided, and started by Open.
class BackendRun {
 public:
  virtual ~BackendRun() = default;
  // Starts what this node hosts for the job (crun's service, when the endpoint is here) and
  // builds the agent's rendezvous; an error ends crun with exit code 1, its message on stderr.
  // `agent` is complete: host_name and log_dir are filled in.
  virtual StatusOr<std::unique_ptr<agent::Rendezvous>> Open(const LaunchPlan& plan,
                                                            boost::asio::io_context& io,
                                                            const agent::AgentOptions& agent) = 0;
  // The agent's run is over: stop what Open started.
  virtual void Close() {}
};

// What a backend's plan reads besides the plan so far: the options (with what Slurm filled in),
// which flags were given, and the machine.
struct PlanInputs {
  const LaunchOptions& o;
  const std::set<std::string>& given;
  const MachineFacts& facts;
};

// `crun status --rdzv-backend NAME`: where to ask, and how.
struct StatusQuery {
  SecurityFlags security;
  std::string backend;
  std::string endpoint;
  std::string run_id;  // empty: every job
  // The backends' own flags (Backend::status_flags), by name: "--etcd-prefix" -> its value.
  std::map<std::string, std::string> flags;
  double timeout = 5;
};
// A flag of `crun status` that one backend declares and reads (StatusQuery::flags).
struct StatusFlag {
  std::string name;           // "--etcd-prefix"
  std::string help;           // "etcd-v3: the prefix of crun's keys"
  std::string default_value;  // shown in the help where not empty
};
// The jobs, into `out`; 0, or the exit code after a message on stderr. *where: what was asked
// ("127.0.0.1:29400"); *final: an answer that asking again will not change (a refusal).
using StatusFetch = std::function<int(const StatusQuery& q, v1::StatusResponse* out,
                                      std::string* where, bool* final)>;

struct Backend {
  std::string name;                    // --rdzv-backend's value: "crun"
  std::vector<std::string> aliases;    // other spellings: "c10d"
  std::string help;                    // for --rdzv-backend's help: what it is and needs
  std::vector<std::string> conf_keys;  // its own --rdzv-conf keys; given to another: an error
  std::string conf_help;               // for --rdzv-conf's help, when it has keys
  // A name kept only to be refused (a backend crun will not speak): the message.
  std::string refusal;
  // Its part when --rdzv-backend is not given: kWithEndpoint, the choice when --rdzv-endpoint
  // is given (and a Slurm step's); kWithoutEndpoint, the choice without one, and always with
  // --standalone. One entry of a table has each.
  enum class Default { kNone, kWithEndpoint, kWithoutEndpoint };
  Default by_default = Default::kNone;
  // Its nodes meet at --rdzv-endpoint, which with the run id names the job; else at
  // --master-addr:--master-port (static).
  bool meets_at_endpoint = false;
  // Its rounds go on without a node that leaves a running job (spares, --nnodes MIN:MAX):
  // --straggler-action exclude needs it. The static backend's round is its nodes, all of them.
  bool leaves_nodes_out = false;
  // Checks what this backend needs of the options and decides its rendezvous: fills in
  // plan.run_id, plan.security and plan.notes, reads its keys from
  // plan.values.rdzv_conf.backend_keys.
  std::function<StatusOr<std::unique_ptr<BackendRun>>(LaunchPlan& plan, const PlanInputs& in)> plan;
  StatusFetch status;  // empty: `crun status` cannot ask this backend
  // For `crun status`: what it asks (--rdzv-backend's help), what --rdzv-endpoint names for it,
  // and its own flags.
  std::string status_help;
  std::string endpoint_help;
  std::vector<StatusFlag> status_flags;
};

using Backends = std::vector<Backend>;

// crun's own: static, crun (c10d) and etcd-v3 (with etcd-v2 refused).
Backends DefaultBackends();

// The entry whose part is `d` when --rdzv-backend is not given; null when none is.
const Backend* DefaultBackend(const Backends& backends, Backend::Default d);

// The entry whose name or alias `name` is; null when none is.
const Backend* FindBackend(const Backends& backends, const std::string& name);

// --rdzv-backend as given (empty: crun's service when an endpoint is given, else static), or
// an error naming the value and what is expected: "--rdzv-backend 'zk': expected ...".
// `usable` limits the choice to entries it accepts (`crun status`: those with a status).
StatusOr<const Backend*> ChooseBackend(const Backends& backends, const std::string& given,
                                       const std::string& flag,
                                       const std::function<bool(const Backend&)>& usable = nullptr);

// Every entry's own --rdzv-conf keys: what ParseRdzvConf keeps aside for the entry's plan.
std::set<std::string> BackendConfKeys(const Backends& backends);

// The help of --rdzv-backend and --rdzv-conf on `app`, from the table.
void DescribeBackends(CLI::App& app, const Backends& backends);

// The node id when --rdzv-conf gives none: one per agent process, as torchrun's c10d backend
// does, so that several cruns on one machine are several nodes: the host name, qualified by
// this host's address toward `endpoint` unless that is loopback, and this crun's pid:
// "gpu7@10.0.0.7#4242". An explicit node_id is an identity that a restarted agent takes over.
std::string DefaultNodeId(const std::string& host_name, const Endpoint& endpoint);

// The settings of a dynamic rendezvous (crun's service, etcd) from --nnodes, --max-restarts and
// --rdzv-conf (plan.values.settings) checked, and plan.heartbeat_interval.
Status PlanDynamicSettings(LaunchPlan& plan);

// The run id of a dynamic rendezvous: --rdzv-id, "default" for torchrun's "none".
std::string DynamicRunId(const LaunchOptions& o);

}  // namespace crun::launcher
