#include "agent/frameworks/contracts.h"

#include <spdlog/spdlog.h>

namespace crun::agent {
namespace {

std::vector<ContractNode> NodesOf(const GroupAssignment& g) {
  std::vector<ContractNode> nodes;
  nodes.reserve(g.members.size());
  for (const RoundMember& m : g.members) nodes.push_back({m.host, m.address, m.nproc, m.ports});
  return nodes;
}

}  // namespace

std::string HorovodHostName(const GroupAssignment& g, std::size_t i) {
  return DistinctHostName(NodesOf(g), i);
}

Status AddContractEnvironment(const ContractSet& contracts, const GroupAssignment& g,
                              int local_rank, Environment& env) {
  const ContractRound round{.contracts = contracts,
                            .nodes = NodesOf(g),
                            .group_rank = g.group_rank,
                            .group_world_size = g.group_world_size,
                            .local_world_size = g.local_world_size,
                            .world_size = g.world_size,
                            .base_rank = g.base_rank,
                            .local_rank = local_rank};
  return crun::AddContractEnvironment(round, env);
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
