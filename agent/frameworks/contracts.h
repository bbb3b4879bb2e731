// The launch contracts of frameworks besides PyTorch (docs/frameworks.md), as the agent uses
// them: each worker's variables from the round crun's rendezvous formed (the contracts'
// descriptors write them: rendezvous/contracts/contracts.cc), and the ports a node reserves.
#pragma once

#include <cstddef>
#include <string>

#include "agent/frameworks/port_reservation.h"
#include "agent/rendezvous/assignment.h"
#include "base/environment.h"
#include "base/status.h"
#include "rendezvous/contracts/contract_set.h"

namespace crun::agent {

// The contract set and its port layout are shared with the rendezvous (one definition:
// rendezvous/contracts/contract_set.h).
using crun::Contract;
using crun::ContractNames;
using crun::ContractNode;
using crun::ContractRound;
using crun::ContractSet;
using crun::DistinctHostName;
using crun::ParseContracts;
using crun::PortLayout;

// Horovod's host name for node `i` of the round: its own, unless another node of the round has
// the same one (several agents on one host), whose local scopes must still differ.
std::string HorovodHostName(const GroupAssignment& group, std::size_t i);

// Adds the variables of every contract in `contracts` for `local_rank` of `group` to `env`
// (crun::AddContractEnvironment, on the round as the contracts see it).
Status AddContractEnvironment(const ContractSet& contracts, const GroupAssignment& group,
                              int local_rank, Environment& env);

// The ports `contracts` need for `nproc` workers, reserved for the join; none when it needs
// none, or when they cannot be had (logged: the workers' start then fails naming them).
PortReservation ReserveContractPorts(const ContractSet& contracts, int nproc);

}  // namespace crun::agent
