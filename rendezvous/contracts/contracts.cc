// crun's launch contracts, one descriptor each (contract_set.h, docs/frameworks.md): what
// TensorFlow, JAX, Horovod, DeepSpeed and MPI-style scripts read from their environment,
// derived from the round crun's rendezvous formed, always on top of torchrun's variables.
// Adding one: its Contract (contract_set.h) and its descriptor at that place in the table.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "base/endpoint.h"
#include "rendezvous/contracts/contract_set.h"

namespace crun {
namespace {

using Ports = ContractSpec::Ports;

std::string Num(int v) { return std::to_string(v); }

// TF_CONFIG: every worker's host:port in global rank order, and this worker's index.
void Tensorflow(const ContractRound& r, Environment& env) {
  nlohmann::json workers = nlohmann::json::array();
  for (std::size_t i = 0; i < r.nodes.size(); ++i) {
    for (int lr = 0; lr < r.nodes[i].nproc; ++lr) {
      workers.push_back(FormatEndpoint(r.nodes[i].address, r.Port(i, Contract::kTensorflow, lr)));
    }
  }
  env["TF_CONFIG"] = nlohmann::json{{"cluster", {{"worker", workers}}},
                                    {"task", {{"type", "worker"}, {"index", r.rank()}}}}
                         .dump();
}

void Jax(const ContractRound& r, Environment& env) {
  env["JAX_COORDINATOR_ADDRESS"] =
      FormatEndpoint(r.nodes.front().address, r.Port(0, Contract::kJax));
  // JAX takes SIGTERM as a preemption notice and keeps running, so every stop of a group would
  // wait the whole --shutdown-timeout for SIGKILL. A user who wants the notice sets it.
  if (!env.contains("JAX_ENABLE_PREEMPTION_SERVICE"))
    env["JAX_ENABLE_PREEMPTION_SERVICE"] = "false";
}

void Horovod(const ContractRound& r, Environment& env) {
  // Cross rank: this node's place among the nodes that have a worker of this local rank.
  int cross_rank = 0, cross_size = 0;
  for (int i = 0; i < static_cast<int>(r.nodes.size()); ++i) {
    if (r.nodes[static_cast<std::size_t>(i)].nproc <= r.local_rank) continue;
    if (i < r.group_rank) ++cross_rank;
    ++cross_size;
  }
  env["HOROVOD_RANK"] = Num(r.rank());
  env["HOROVOD_SIZE"] = Num(r.world_size);
  env["HOROVOD_LOCAL_RANK"] = Num(r.local_rank);
  env["HOROVOD_LOCAL_SIZE"] = Num(r.local_world_size);
  env["HOROVOD_CROSS_RANK"] = Num(cross_rank);
  env["HOROVOD_CROSS_SIZE"] = Num(cross_size);
  env["HOROVOD_HOSTNAME"] = DistinctHostName(r.nodes, static_cast<std::size_t>(r.group_rank));
  env["HOROVOD_CONTROLLER"] = "gloo";
  env["HOROVOD_CPU_OPERATIONS"] = "gloo";
  // Group rank 0's crun serves the round's rendezvous on the port it reserved.
  env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = r.nodes.front().address;
  env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = std::to_string(r.Port(0, Contract::kHorovod));
}

void Deepspeed(const ContractRound& r, Environment& env) {
  env["LOCAL_SIZE"] = Num(r.local_world_size);
  env["CROSS_RANK"] = Num(r.group_rank);
  env["CROSS_SIZE"] = Num(r.group_world_size);
}

void Mpi(const ContractRound& r, Environment& env) {
  env["OMPI_COMM_WORLD_RANK"] = Num(r.rank());
  env["OMPI_COMM_WORLD_SIZE"] = Num(r.world_size);
  env["OMPI_COMM_WORLD_LOCAL_RANK"] = Num(r.local_rank);
  env["OMPI_COMM_WORLD_LOCAL_SIZE"] = Num(r.local_world_size);
  env["OMPI_COMM_WORLD_NODE_RANK"] = Num(r.group_rank);
}

// The round's nodes checked against what the contracts need of them.
Status CheckNodes(const ContractRound& r) {
  const auto n = static_cast<int>(r.nodes.size());
  if (n != r.group_world_size || r.group_rank < 0 || r.group_rank >= n) {
    return InvalidArgument(
        "--contract " + r.contracts.ToString() + " needs every node's address and ports, and " +
        "the round has those of " + Num(n) + " of its " + Num(r.group_world_size) +
        " nodes (did this node reserve its ports? its log says)");
  }
  int workers = 0;
  for (int i = 0; i < n; ++i) {
    const ContractNode& m = r.nodes[static_cast<std::size_t>(i)];
    if (Status fits = PortLayout(r.contracts, m.nproc).Check(m.ports.size()); !fits.ok()) {
      return InvalidArgument("node " + Num(i) + " (" + m.host + ") has " + fits.message() +
                             ": is it running crun with another --contract?");
    }
    workers += m.nproc;
  }
  if (workers != r.world_size) {
    return InvalidArgument("the round's nodes run " + Num(workers) + " workers, not " +
                           Num(r.world_size));
  }
  return Status::Ok();
}

}  // namespace

// In Contract's order: a contract's place is its bit.
std::vector<ContractSpec> CrunContracts() {
  return {
      {.name = "torch"},
      {.name = "tensorflow",
       .aliases = {"tf"},
       .gives = "TF_CONFIG",
       .ports = Ports::kPerWorker,
       .environment = Tensorflow},
      {.name = "jax",
       .gives = "JAX_COORDINATOR_ADDRESS",
       .ports = Ports::kPerNode,
       .environment = Jax},
      {.name = "horovod",
       .gives = "and its HTTP rendezvous",
       .ports = Ports::kPerNode,
       .round_server = true,
       .environment = Horovod},
      {.name = "deepspeed", .environment = Deepspeed},
      {.name = "mpi", .gives = "OMPI_COMM_WORLD_*", .environment = Mpi},
  };
}

std::string DistinctHostName(const std::vector<ContractNode>& nodes, std::size_t i) {
  const std::string& host = nodes[i].host;
  const auto same = std::count_if(nodes.begin(), nodes.end(),
                                  [&](const ContractNode& m) { return m.host == host; });
  return same > 1 ? host + "-node" + std::to_string(i) : host;
}

Status AddContractEnvironment(const ContractRound& round, Environment& env) {
  if (round.contracts.NeedsPorts()) {
    if (Status s = CheckNodes(round); !s.ok()) return s;
  }
  for (Contract c : round.contracts.contracts()) {
    if (const auto& write = SpecOf(c).environment) write(round, env);
  }
  return Status::Ok();
}

}  // namespace crun
