#include "launcher/backends/static.h"

#include <cstdio>
#include <random>

#include "agent/rendezvous/static_rendezvous.h"
#include "base/host_addresses.h"
#include "launcher/plan.h"

namespace crun::launcher {
namespace {

std::string RandomRunId() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

class StaticRun final : public BackendRun {
 public:
  explicit StaticRun(bool multi_node) : multi_node_(multi_node) {}
  bool multi_node() const { return multi_node_; }

  StatusOr<std::unique_ptr<agent::Rendezvous>> Open(const LaunchPlan& p,
                                                    boost::asio::io_context& io,
                                                    const agent::AgentOptions& a) override {
    const LaunchOptions& o = p.o;
    agent::StaticRendezvousOptions r;
    r.run_id = p.run_id;
    r.role = o.role;
    r.nproc = p.nproc;
    r.host = a.host_name;
    // The job's settings, as the dynamic backends get them; one node's round is itself.
    r.settings = p.values.settings;
    if (!multi_node_) r.settings.min_nodes = r.settings.max_nodes = 1;
    r.store_host = o.local_addr.empty() ? o.master_addr : o.local_addr;
    r.virtual_local_rank = o.virtual_local_rank;
    r.store_port = p.values.master_port > 0 ? static_cast<std::uint16_t>(p.values.master_port) : 0;
    r.store_linger = a.shutdown_timeout;
    r.advertise_addr = o.local_addr;
    r.wait_for_all = !a.health.checks.empty();
    if (p.slurm_task) SlurmTask(*p.slurm_task, r);
    if (multi_node_) {
      r.node_rank = p.values.node_rank;
      r.static_store = true;
      r.host_store = p.values.node_rank == 0;
      r.store_host = o.master_addr;
      r.bind_host = BindAddressFor(o.master_addr);
      r.store_port = static_cast<std::uint16_t>(p.values.master_port);
    }
    return agent::MakeStaticRendezvous(io, r);
  }

 private:
  // One crun per Slurm task: the ranks and sizes are the task's; task 0 hosts the store.
  static void SlurmTask(const SlurmTaskSettings& t, agent::StaticRendezvousOptions& r) {
    r.static_store = true;
    r.host_store = t.rank == 0;
    r.store_host = t.master_addr;
    r.bind_host = BindAddressFor(t.master_addr);
    r.store_port = static_cast<std::uint16_t>(t.master_port);
    r.fixed_group =
        agent::RoundPlace{.group_rank = t.group_rank,
                          .group_world_size = t.group_world_size,
                          .world_size = t.world_size,
                          .base_rank =
                              t.rank -
                              t.local_rank,  // so that RANK = base + LOCAL_RANK = SLURM_PROCID
                          .local_world_size = t.local_world_size};
    r.first_local_rank = t.local_rank;
  }

  bool multi_node_;
};

// --standalone, as torchrun: one node with its own rendezvous that nobody else can reach. A
// range such as 1:2 is accepted (torchrun's tutorials use it); nobody else can join, so it
// runs now.
Status PlanStandalone(LaunchPlan& p, const LaunchOptions& o) {
  if (p.values.settings.min_nodes != 1) {
    return InvalidArgument("--standalone runs one node; --nnodes '" + o.nnodes +
                           "' needs at least " + std::to_string(p.values.settings.min_nodes));
  }
  if (p.values.settings.max_nodes != 1) {
    p.notes.push_back("--standalone: running one node (--nnodes " + o.nnodes +
                      ": no other node can join a standalone job)");
    p.values.settings.max_nodes = 1;
  }
  return Status::Ok();
}

// "--node-rank 2", or "JOB_COMPLETION_INDEX=2" when the pod gave it.
std::string NodeRankFrom(const LaunchPlan& p) {
  if (!p.node_rank_from.empty()) return p.node_rank_from;
  return "--node-rank " + std::to_string(p.values.node_rank);
}

// torchrun's static backend: a fixed number of nodes, each with its rank, and the store's port.
Status PlanStaticNodes(const LaunchPlan& p, const LaunchOptions& o) {
  if (p.values.settings.min_nodes != p.values.settings.max_nodes) {
    return InvalidArgument("--nnodes '" + o.nnodes +
                           "': the static backend needs a fixed "
                           "number of nodes (use --rdzv-endpoint for an elastic range)");
  }
  if (p.values.node_rank >= p.values.settings.max_nodes) {
    return InvalidArgument(NodeRankFrom(p) + " is not below --nnodes " +
                           std::to_string(p.values.settings.max_nodes));
  }
  if (p.values.master_port <= 0) {
    return InvalidArgument("the static backend needs --master-port (the store node 0 hosts)");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<BackendRun>> Plan(LaunchPlan& p, const PlanInputs& in) {
  const LaunchOptions& o = in.o;
  if (o.standalone) CRUN_RETURN_IF_ERROR(PlanStandalone(p, o));
  const bool multi_node = !o.standalone && p.values.settings.max_nodes > 1;
  if (multi_node) {
    CRUN_RETURN_IF_ERROR(PlanStaticNodes(p, o));
  } else if (p.values.node_rank != 0) {
    return InvalidArgument(NodeRankFrom(p) + " on a one-node job");
  }
  for (const char* flag : {"--token-file", "--tls-cert", "--tls-key", "--tls-ca"}) {
    if (in.given.count(flag)) {
      return InvalidArgument(std::string(flag) +
                             " secures crun's rendezvous service: it "
                             "needs --rdzv-endpoint (or --slurm)");
    }
  }
  // --standalone, and one node with no --master-port (torchrun 2.x then switches to standalone
  // itself), get a fresh run id; the static backend keeps the given id, "none" by default, the
  // same on every node, as torchrun does.
  const bool fresh = o.standalone || (!multi_node && !p.slurm_task && o.rdzv_id == "none" &&
                                      p.values.master_port <= 0);
  p.run_id = fresh ? RandomRunId() : o.rdzv_id;
  return std::unique_ptr<BackendRun>(std::make_unique<StaticRun>(multi_node));
}

}  // namespace

Backend StaticBackend() {
  Backend b;
  b.name = "static";
  b.by_default = Backend::Default::kWithoutEndpoint;
  b.help =
      "fixed --node-rank with the store at --master-addr:--master-port (one node: a store of "
      "its own)";
  b.plan = Plan;
  return b;
}

bool PlansStaticNodes(const LaunchPlan& plan) {
  const auto* run = dynamic_cast<const StaticRun*>(plan.rendezvous.get());
  return run != nullptr && run->multi_node();
}

}  // namespace crun::launcher
