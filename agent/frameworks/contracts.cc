#include "agent/frameworks/contracts.h"

#include <algorithm>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/endpoint.h"

namespace crun::agent {
namespace {

std::string Num(int v) { return std::to_string(v); }

// The round's members checked against what the contracts need of them.
Status CheckMembers(const ContractSet& contracts, const GroupAssignment& g) {
  const auto n = static_cast<int>(g.members.size());
  if (n != g.group_world_size || g.group_rank < 0 || g.group_rank >= n) {
    return InvalidArgument(
        "--contract " + contracts.ToString() + " needs every node's address and ports, and " +
        "the round has those of " + Num(n) + " of its " + Num(g.group_world_size) +
        " nodes (did this node reserve its ports? its log says)");
  }
  int workers = 0;
  for (int i = 0; i < n; ++i) {
    const RoundMember& m = g.members[static_cast<std::size_t>(i)];
    if (Status fits = PortLayout(contracts, m.nproc).Check(m.ports.size()); !fits.ok()) {
      return InvalidArgument("node " + Num(i) + " (" + m.host + ") has " + fits.message() +
                             ": is it running crun with another --contract?");
    }
    workers += m.nproc;
  }
  if (workers != g.world_size) {
    return InvalidArgument("the round's nodes run " + Num(workers) + " workers, not " +
                           Num(g.world_size));
  }
  return Status::Ok();
}

// TF_CONFIG: every worker's host:port in global rank order, and this worker's index.
std::string TfConfig(const ContractSet& contracts, const GroupAssignment& g, int rank) {
  nlohmann::json workers = nlohmann::json::array();
  for (const RoundMember& m : g.members) {
    const PortLayout layout(contracts, m.nproc);
    for (int lr = 0; lr < m.nproc; ++lr) {
      workers.push_back(FormatEndpoint(m.address, m.ports[*layout.Worker(lr)]));
    }
  }
  return nlohmann::json{{"cluster", {{"worker", workers}}},
                        {"task", {{"type", "worker"}, {"index", rank}}}}
      .dump();
}

}  // namespace

std::string HorovodHostName(const GroupAssignment& g, std::size_t i) {
  const std::string& host = g.members[i].host;
  const auto same = std::count_if(g.members.begin(), g.members.end(),
                                  [&](const RoundMember& m) { return m.host == host; });
  return same > 1 ? host + "-node" + std::to_string(i) : host;
}

Status AddContractEnvironment(const ContractSet& contracts, const GroupAssignment& g,
                              int local_rank, Environment& env) {
  const int rank = g.base_rank + local_rank;
  auto set = [&env](const char* name, const std::string& value) { env[name] = value; };
  if (contracts.NeedsPorts()) {
    if (Status s = CheckMembers(contracts, g); !s.ok()) return s;
  }
  if (contracts.Has(Contract::kTensorflow)) set("TF_CONFIG", TfConfig(contracts, g, rank));
  if (contracts.Has(Contract::kJax)) {
    const RoundMember& first = g.members.front();
    const auto port = first.ports[*PortLayout(contracts, first.nproc).Jax()];
    set("JAX_COORDINATOR_ADDRESS", FormatEndpoint(first.address, port));
    // JAX takes SIGTERM as a preemption notice and keeps running, so every stop of a group
    // would wait the whole --shutdown-timeout for SIGKILL. A user who wants the notice sets it.
    if (!env.contains("JAX_ENABLE_PREEMPTION_SERVICE")) {
      set("JAX_ENABLE_PREEMPTION_SERVICE", "false");
    }
  }
  if (contracts.Has(Contract::kHorovod)) {
    // Cross rank: this node's place among the nodes that have a worker of this local rank.
    int cross_rank = 0, cross_size = 0;
    for (int i = 0; i < static_cast<int>(g.members.size()); ++i) {
      if (g.members[static_cast<std::size_t>(i)].nproc <= local_rank) continue;
      if (i < g.group_rank) ++cross_rank;
      ++cross_size;
    }
    set("HOROVOD_RANK", Num(rank));
    set("HOROVOD_SIZE", Num(g.world_size));
    set("HOROVOD_LOCAL_RANK", Num(local_rank));
    set("HOROVOD_LOCAL_SIZE", Num(g.local_world_size));
    set("HOROVOD_CROSS_RANK", Num(cross_rank));
    set("HOROVOD_CROSS_SIZE", Num(cross_size));
    set("HOROVOD_HOSTNAME", HorovodHostName(g, static_cast<std::size_t>(g.group_rank)));
    set("HOROVOD_CONTROLLER", "gloo");
    set("HOROVOD_CPU_OPERATIONS", "gloo");
    // Group rank 0's crun serves the round's rendezvous on the port it reserved.
    const RoundMember& first = g.members.front();
    set("HOROVOD_GLOO_RENDEZVOUS_ADDR", first.address);
    set("HOROVOD_GLOO_RENDEZVOUS_PORT",
        std::to_string(first.ports[*PortLayout(contracts, first.nproc).Horovod()]));
  }
  if (contracts.Has(Contract::kDeepspeed)) {
    set("LOCAL_SIZE", Num(g.local_world_size));
    set("CROSS_RANK", Num(g.group_rank));
    set("CROSS_SIZE", Num(g.group_world_size));
  }
  if (contracts.Has(Contract::kMpi)) {
    set("OMPI_COMM_WORLD_RANK", Num(rank));
    set("OMPI_COMM_WORLD_SIZE", Num(g.world_size));
    set("OMPI_COMM_WORLD_LOCAL_RANK", Num(local_rank));
    set("OMPI_COMM_WORLD_LOCAL_SIZE", Num(g.local_world_size));
    set("OMPI_COMM_WORLD_NODE_RANK", Num(g.group_rank));
  }
  return Status::Ok();
}

PortReservation ReserveContractPorts(const ContractSet& contracts, int nproc) {
  const int n = PortLayout(contracts, nproc).count();
  if (n == 0) return PortReservation();
  auto r = PortReservation::Reserve(n);
  if (r.ok()) return std::move(r).value();
  spdlog::error("cannot reserve {} ports for --contract {}: {}", n, contracts.ToString(),
                r.status().message());
  return PortReservation();
}

}  // namespace crun::agent
