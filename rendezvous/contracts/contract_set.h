// The launch contracts a job's workers get (--contract, docs/frameworks.md) and the ports a
// node reserves for them. One definition, called by everyone who must agree on it: the agent
// (which reserves the ports and writes the variables, agent/frameworks/contracts.h), crun's service
// and etcd (which refuse a node whose ports do not fit its contracts, through the rendezvous rules)
// and the static exchange (which merges the ports of one node's crun processes). Pure values; no
// I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace crun {

enum class Contract : std::uint8_t { kTorch, kTensorflow, kJax, kHorovod, kDeepspeed, kMpi };

// Which contracts a job's workers get; torch always.
class ContractSet {
 public:
  bool Has(Contract c) const { return (bits_ & Bit(c)) != 0; }
  void Add(Contract c) { bits_ |= Bit(c); }
  // "torch", "torch,tensorflow,jax": the names --contract takes, in a fixed order.
  std::string ToString() const;
  // tensorflow, jax and horovod need every node's address and ports (Horovod its cross
  // ranks), which only a rendezvous that exchanges them gives (the service, etcd, one node).
  bool NeedsPorts() const {
    return Has(Contract::kTensorflow) || Has(Contract::kJax) || Has(Contract::kHorovod);
  }
  // The wire form (crun.v1.Settings.contracts): one bit a contract. 0, what an agent that
  // predates the field sends, is torch alone. Bits this crun does not know are kept, so that
  // Known() can refuse them by name rather than drop them.
  std::uint32_t bits() const { return bits_; }
  static ContractSet FromBits(std::uint32_t bits);
  bool Known() const { return (bits_ & ~kAllBits) == 0; }
  bool operator==(const ContractSet&) const = default;

 private:
  static constexpr std::uint32_t Bit(Contract c) { return 1u << static_cast<unsigned>(c); }
  static constexpr std::uint32_t kAllBits = (1u << (static_cast<unsigned>(Contract::kMpi) + 1)) - 1;
  std::uint32_t bits_ = Bit(Contract::kTorch);
};

// The names --contract takes: torch, tensorflow (or tf), jax, horovod, deepspeed, mpi.
const std::vector<std::string>& ContractNames();

// A comma-separated list of names. An unknown one is refused naming it and the closest name:
// "unknown contract 'tensorflw' (did you mean tensorflow?); known: torch, tensorflow, ...".
StatusOr<ContractSet> ParseContracts(const std::string& list);

// Which of a node's reserved ports is which, for its contracts and its `nproc` workers. A node
// reserves, in this order: one port per worker with tensorflow (each worker's gRPC server),
// then one with jax (the coordinator), then one with horovod (its HTTP rendezvous). The last
// two are used on group rank 0's node only, but every node reserves them, so that any node can
// be rank 0. A round's members carry their ports in this order (RoundMember::ports).
class PortLayout {
 public:
  PortLayout(const ContractSet& contracts, int nproc);

  // How many ports the node reserves.
  int count() const { return count_; }
  // The first `worker_ports()` ports are the workers' own, in local-rank order.
  int worker_ports() const { return worker_ports_; }
  // The index of local rank `local_rank`'s own port (tensorflow), JAX's coordinator or
  // Horovod's rendezvous; nullopt where the contracts give none.
  std::optional<std::size_t> Worker(int local_rank) const;
  std::optional<std::size_t> Jax() const { return jax_; }
  std::optional<std::size_t> Horovod() const { return horovod_; }
  // Whether `reserved` ports fit. An error names the numbers and the contract set: "4
  // reserved ports for 2 workers where --contract torch,tensorflow,jax needs 3".
  Status Check(std::size_t reserved) const;

 private:
  ContractSet contracts_;
  int nproc_ = 0;
  int worker_ports_ = 0;
  std::optional<std::size_t> jax_;
  std::optional<std::size_t> horovod_;
  int count_ = 0;
};

}  // namespace crun
