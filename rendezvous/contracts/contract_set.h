// The launch contracts a job's workers get (--contract, docs/frameworks.md) and the ports a
// node reserves for them. One descriptor per contract (contracts.cc): its names, its bit, the
// ports it needs, what its workers get and whether crun serves its round. Everything else is
// read from the table: the names --contract takes, its help and refusals, NeedsPorts and the
// port layout. One definition, called by everyone who must agree on it: the agent (which
// reserves the ports and writes the variables, agent/frameworks/contracts.h), crun's service
// and etcd (which refuse a node whose ports do not fit its contracts, through the rendezvous
// rules) and the static exchange (which merges the ports of one node's crun processes). Pure
// values; no I/O.
//
// Adding one (docs/architecture.md): its descriptor in contracts.cc's table. A test registers a
// test-only one with RegisterContract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/environment.h"
#include "base/status.h"

namespace crun {

// A contract is its place in the table, which is also its bit on the wire.
enum class Contract : std::uint8_t { kTorch, kTensorflow, kJax, kHorovod, kDeepspeed, kMpi };

// Which contracts a job's workers get; torch always.
class ContractSet {
 public:
  bool Has(Contract c) const { return (bits_ & Bit(c)) != 0; }
  void Add(Contract c) { bits_ |= Bit(c); }
  // "torch", "torch,tensorflow,jax": the names --contract takes, in the table's order.
  std::string ToString() const;
  // Whether a contract of the set needs every node's address and ports (TensorFlow, JAX,
  // Horovod), which only a rendezvous that exchanges them gives (the service, etcd, one node).
  bool NeedsPorts() const;
  // The wire form (crun.v1.Settings.contracts): one bit a contract. 0, what an agent that
  // predates the field sends, is torch alone. Bits this crun does not know are kept, so that
  // Known() can refuse them by name rather than drop them.
  std::uint32_t bits() const { return bits_; }
  static ContractSet FromBits(std::uint32_t bits);
  bool Known() const;
  // The contracts of the set, in the table's order.
  std::vector<Contract> contracts() const;
  bool operator==(const ContractSet&) const = default;

 private:
  static constexpr std::uint32_t Bit(Contract c) { return 1u << static_cast<unsigned>(c); }
  std::uint32_t bits_ = Bit(Contract::kTorch);
};

// One node of a round as a contract's variables need it (the agent's RoundMember).
struct ContractNode {
  std::string host;     // its host name
  std::string address;  // where other nodes' workers reach its workers
  int nproc = 0;
  std::vector<std::uint16_t> ports;  // as PortLayout lays them out for its nproc
};

// What a contract's variables are made of: one worker's place in the round.
struct ContractRound {
  ContractSet contracts;
  std::vector<ContractNode> nodes;  // every node of the round, in group-rank order
  int group_rank = 0;
  int group_world_size = 1;
  int local_world_size = 1;
  int world_size = 1;
  int base_rank = 0;  // RANK of this node's local rank 0
  int local_rank = 0;
  int rank() const { return base_rank + local_rank; }
  // Node `node`'s port for contract `c` (for `local_rank`, where it has one a worker).
  std::uint16_t Port(std::size_t node, Contract c, int local_rank = 0) const;
};

struct ContractSpec {
  enum class Ports { kNone, kPerWorker, kPerNode };
  std::string name{};                  // --contract's word: "tensorflow"
  std::vector<std::string> aliases{};  // other words: "tf"
  std::string gives{};                 // for --contract's help: "TF_CONFIG"
  // The ports every node reserves for it: none, one per worker (each worker's own server), or
  // one (used on group rank 0's node only; every node reserves it, so that any can be rank 0).
  Ports ports = Ports::kNone;
  // crun's group rank 0 serves the round's key-value rendezvous on its port (Horovod's).
  bool round_server = false;
  // The variables a worker gets, added to torchrun's; null: none.
  std::function<void(const ContractRound&, Environment&)> environment{};
};

// Every contract, indexed by Contract: crun's own (contracts.cc), then any registered.
const std::vector<ContractSpec>& ContractSpecs();
const ContractSpec& SpecOf(Contract c);
// Adds `spec` to the table (tests: a contract of their own); its Contract. At most 32.
Contract RegisterContract(ContractSpec spec);
// Takes the last registered contract, `c`, off the table again (a test's end).
void UnregisterContract(Contract c);

// Adds the variables of every contract of `round.contracts` for its worker to `env` (torchrun's
// are there already). A round whose nodes do not carry what a contract needs (no nodes, or
// ports that do not match the contracts: a node started with another --contract) is refused
// with an error that says which node.
Status AddContractEnvironment(const ContractRound& round, Environment& env);

// Node `i`'s host name where the nodes' names must differ (Horovod's local scope): its own,
// unless another node of the round has the same one (several agents on one host).
std::string DistinctHostName(const std::vector<ContractNode>& nodes, std::size_t i);

// Every word --contract takes: each contract's name in the table's order, then the aliases.
std::vector<std::string> ContractNames();
// --contract's help: "tensorflow (tf: TF_CONFIG), jax (JAX_COORDINATOR_ADDRESS), ...".
std::string DescribeContracts();

// A comma-separated list of names. An unknown one is refused naming it and the closest name:
// "unknown contract 'tensorflw' (did you mean tensorflow?); known: torch, tensorflow (tf), ...".
StatusOr<ContractSet> ParseContracts(const std::string& list);

// Which of a node's reserved ports is which, for its contracts and its `nproc` workers. A node
// reserves, in this order: one port per worker for each per-worker contract, then one for each
// per-node contract, each group in the table's order (tensorflow's workers, then jax's
// coordinator, then horovod's rendezvous). A round's members carry their ports in this order.
class PortLayout {
 public:
  PortLayout(const ContractSet& contracts, int nproc);

  // How many ports the node reserves.
  int count() const { return count_; }
  // The first `worker_ports()` ports are the workers' own, per contract in local-rank order.
  int worker_ports() const { return worker_ports_; }
  // The index of contract `c`'s port (for `local_rank`, where it has one a worker); nullopt
  // where the set gives it none.
  std::optional<std::size_t> Port(Contract c, int local_rank = 0) const;
  // Whether `reserved` ports fit. An error names the numbers and the contract set: "4
  // reserved ports for 2 workers where --contract torch,tensorflow,jax needs 3".
  Status Check(std::size_t reserved) const;

 private:
  ContractSet contracts_;
  int nproc_ = 0;
  int worker_ports_ = 0;
  std::vector<int> first_;  // per contract: its first port's index, -1 for none
  int count_ = 0;
};

}  // namespace crun
