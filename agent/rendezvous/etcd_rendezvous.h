// The agent's rendezvous through etcd's v3 API (--rdzv-backend etcd-v3): no crun process is
// special, and the job outlives the loss of any one machine (docs/rendezvous.md, "On etcd").
//
// * The agent holds a lease (TTL: heartbeat_timeout) and, bound to it, its nodes/ key; a join
//   writes joins/<node id>; failures and successes are written under reports/. One agent, the
//   one holding a/decider, decides (rendezvous/etcd/job.h): it folds those keys into the state
//   with the rendezvous rules, in transactions that compare the state's revision, and
//   publishes a/job when the agents must act. The decider watches the run's whole prefix; the
//   others watch a/ only and act on a/job: an assignment, "stop and rejoin", the outcome. When
//   the decider's lease ends, the others race to take its place.
// * The round's c10d store is served by the crun of the round's group rank 0, which writes its
//   address to stores/<round>; the others start their workers once it is there. If that node
//   dies, its lease ends, the survivors re-form and another node serves the next round's store.
// * Its roles, each in agent/rendezvous/etcd/ and tested alone (tests/unit/agent/
//   etcd_roles_test.cc): this node's lease and key (node_lease.h), the election (election.h),
//   the decider's write (decider.h), a node's assignment from the job document (assignment.h)
//   and the round's store (round_store.h). etcd_rendezvous.cc wires them on its etcd thread
//   with the watch of the run's keys and the agent's events.
// * etcd unreachable at the start: the job ends here within connect_timeout, naming the
//   endpoints, with nothing started. Unreachable while workers run (its quorum lost): they run
//   on and the agent keeps trying for outage_timeout, then ends the job here.
// * Its lease expired while it was cut off: the other nodes have re-formed without it, so it
//   stops its workers and joins again as a new member.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/rendezvous/rendezvous.h"
#include "base/security.h"
#include "rendezvous/etcd/job.h"
#include "rendezvous/rules/rules.h"
#include "rendezvous/rules/stragglers.h"

namespace crun::agent {

struct EtcdRendezvousOptions {
  std::vector<std::string> endpoints;  // "host:port" of etcd's members
  std::string root = "/crun/rdzv";     // keys live under <root>/<run id>/
  std::string run_id;
  std::string role = "default";
  std::string node_id;
  std::string host;                    // for reports and rank order
  std::vector<std::string> addresses;  // this node's, for the round store's allow list
  std::string advertise_addr;          // MASTER_ADDR when this node serves the round's store
  int nproc = 1;
  std::optional<int> requested_rank;
  rdzv::Settings settings;
  Security security;  // TLS to etcd
  std::string user;   // etcd auth; the password comes from a file, never argv
  std::string password;
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds outage_timeout{60'000};
  bool virtual_local_rank = false;
  // Slow ranks judged job-wide (rendezvous/etcd/stragglers.h): the decider's settings.
  rdzv::StragglerSettings straggler_settings;
  // How long the run's keys outlive the job's end (--rdzv-conf etcd_retention; 0: until removed).
  std::chrono::seconds retention = etcd::kDefaultRetention;
};

std::unique_ptr<Rendezvous> MakeEtcdRendezvous(boost::asio::io_context& io,
                                               const EtcdRendezvousOptions& options);

}  // namespace crun::agent
