// The launch contracts of frameworks besides PyTorch (docs/frameworks.md): what TensorFlow,
// JAX, Horovod, DeepSpeed and MPI-style scripts read from their environment, derived from the
// round crun's rendezvous formed. Every contract is added to torchrun's variables, never in
// their place. Pure: the round in, variables out.
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
using crun::ContractSet;
using crun::ParseContracts;
using crun::PortLayout;

// Horovod's host name for node `i` of the round: its own, unless another node of the round has
// the same one (several agents on one host), whose local scopes must still differ.
std::string HorovodHostName(const GroupAssignment& group, std::size_t i);

// Adds the variables of every contract in `contracts` for `local_rank` of `group` to `env`
// (torchrun's are there already). A round whose members do not carry what a contract needs
// (no members, or ports that do not match the contracts: a node started with another
// --contract) is refused with an error that says which node.
Status AddContractEnvironment(const ContractSet& contracts, const GroupAssignment& group,
                              int local_rank, Environment& env);

// The ports `contracts` need for `nproc` workers, reserved for the join; none when it needs
// none, or when they cannot be had (logged: the workers' start then fails naming them).
PortReservation ReserveContractPorts(const ContractSet& contracts, int nproc);

}  // namespace crun::agent
