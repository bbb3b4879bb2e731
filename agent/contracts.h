// The launch contracts of frameworks besides PyTorch (docs/frameworks.md): what TensorFlow,
// JAX, Horovod, DeepSpeed and MPI-style scripts read from their environment, derived from the
// round crun's rendezvous formed. Every contract is added to torchrun's variables, never in
// their place. Pure: the round in, variables out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "base/status.h"

namespace crun::agent {

enum class Contract : std::uint8_t { kTorch, kTensorflow, kJax, kHorovod, kDeepspeed, kMpi };

// Which contracts a job's workers get; torch always.
class ContractSet {
 public:
  bool Has(Contract c) const { return (bits_ & Bit(c)) != 0; }
  void Add(Contract c) { bits_ |= Bit(c); }
  // "torch", "torch,tensorflow,jax": the names --contract takes, in a fixed order.
  std::string ToString() const;
  // Ports each node reserves for a round, for `nproc` workers: one per worker with
  // tensorflow (each worker's gRPC server), then one with jax (the coordinator), then one with
  // horovod (its HTTP rendezvous); the last two are used on group rank 0's node only.
  // RoundMember::ports holds them in that order.
  int PortsToReserve(int nproc) const;
  int JaxPort(int nproc) const { return Has(Contract::kTensorflow) ? nproc : 0; }
  int HorovodPort(int nproc) const { return JaxPort(nproc) + (Has(Contract::kJax) ? 1 : 0); }
  // tensorflow, jax and horovod need every node's address and ports (Horovod its cross
  // ranks), which only a rendezvous that exchanges them gives (the service, etcd, one node).
  bool NeedsPorts() const {
    return Has(Contract::kTensorflow) || Has(Contract::kJax) || Has(Contract::kHorovod);
  }
  bool operator==(const ContractSet&) const = default;

 private:
  static std::uint32_t Bit(Contract c) { return 1u << static_cast<unsigned>(c); }
  std::uint32_t bits_ = Bit(Contract::kTorch);
};

// The names --contract takes: torch, tensorflow (or tf), jax, horovod, deepspeed, mpi.
const std::vector<std::string>& ContractNames();

// A comma-separated list of names. An unknown one is refused naming it and the closest name:
// "unknown contract 'tensorflw' (did you mean tensorflow?); known: torch, tensorflow, ...".
StatusOr<ContractSet> ParseContracts(const std::string& list);

// Horovod's host name for node `i` of the round: its own, unless another node of the round has
// the same one (several agents on one host), whose local scopes must still differ.
std::string HorovodHostName(const GroupAssignment& group, std::size_t i);

// Adds the variables of every contract in `contracts` for `local_rank` of `group` to `env`
// (torchrun's are there already). A round whose members do not carry what a contract needs
// (no members, or ports that do not match the contracts: a node started with another
// --contract) is refused with an error that says which node.
Status AddContractEnvironment(const ContractSet& contracts, const GroupAssignment& group,
                              int local_rank, Environment& env);

}  // namespace crun::agent
