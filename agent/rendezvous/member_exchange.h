// What --contract needs of the other nodes (agent/frameworks/contracts.h: their addresses and
// reserved ports), exchanged over the one store a static rendezvous shares: torchrun's static
// backend (node 0 hosts the store for the whole job) and one crun per Slurm task (task 0 hosts it).
//
// Every crun of the job publishes itself under a key of its round, then waits for everyone's
// before its workers start; the round's members follow from them. Rounds are counted by each
// crun, and kept together: the first crun to begin a round says so under the round's "begun"
// key, and every crun watches for the next round's while its workers run, restarting its
// group when another began one (a TensorFlow, JAX or Horovod group restarts as a whole). A
// crun whose peers do not publish within the timeout gives up naming them.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/rendezvous/assignment.h"
#include "base/status.h"
#include "rendezvous/contracts/contract_set.h"
#include "rendezvous/rules/rules.h"
#include "rendezvous/store/store.h"

namespace crun::agent {

// One crun of the job: a node (static backend), or a Slurm task (one worker).
struct Participant {
  int index = 0;       // its key: the node rank, or the task's global rank
  int node = 0;        // its node (group rank): the tasks of one node make one member
  int local_rank = 0;  // its first local rank (a task's SLURM_LOCALID)
  int nproc = 1;       // its workers
  std::string host;
  std::string address;  // where the other nodes' workers reach its workers
  // Its ports as PortLayout(contracts, nproc) lays them out: its workers' own in local-rank
  // order (tensorflow), then the node's (jax, horovod).
  std::vector<std::uint16_t> ports;
};

std::string ExchangeKey(int round, int index);
std::string BegunKey(int round);  // set by every crun that begins `round`: RoundBegun's form

// Who began a round, and after which failure of its workers (none from a crun that began it
// after another's, or an older crun): what the others weigh by the same rules
// (rdzv::OnFailure), so that every crun of the job keeps the same restart budget and crash-loop
// count. A crun whose failure ends the job says so the same way, as the next round's beginner.
struct RoundBegun {
  int index = 0;
  std::optional<rdzv::Failure> after;
};
std::string EncodeBegun(const RoundBegun& b);
StatusOr<RoundBegun> DecodeBegun(const std::string& key, const std::string& text);
std::string EncodeParticipant(const Participant& p);
// `index` is the key's; the error names it, and ports that do not fit `contracts`.
StatusOr<Participant> DecodeParticipant(std::string_view text, int index,
                                        const ContractSet& contracts);

// The round's members in node order, each node's ports laid out for its workers as
// PortLayout says: every participant's workers' own ports in local-rank order, followed by the
// node's ports of its first local rank's participant. An error names the node or participant
// that does not fit (a gap, a repeated local rank).
StatusOr<std::vector<RoundMember>> MembersOf(std::vector<Participant> all,
                                             const ContractSet& contracts);

struct ExchangeOptions {
  int round = 0;
  int participants = 1;
  std::string who = "node";  // what an index is, in errors: "node" or "Slurm task"
  ContractSet contracts;     // what the ports are for (every participant runs the same set)
  Millis timeout{600000};
  // Set by another thread to give up (the agent is stopping); checked between short waits.
  const std::atomic<bool>* stop = nullptr;
  // The failure of this crun's workers that made it begin the round, if it did (RoundBegun).
  std::optional<rdzv::Failure> after;
};

// Says on `store` that `self` began the round, publishes `self`, and returns the members once
// every participant has published, or an error that names the missing ones (kTimeout) or says
// the exchange was stopped (kAborted).
StatusOr<std::vector<RoundMember>> ExchangeMembers(Store& store, const Participant& self,
                                                   const ExchangeOptions& options);

// Waits, for as long as the round lasts, until some crun begins `round`: returns who and after
// which failure, or kAborted once `stop` is set, or the store's error (the store went away).
StatusOr<RoundBegun> WatchForRound(Store& store, int round, const std::atomic<bool>& stop);

}  // namespace crun::agent
