// The agent's rendezvous through the crun.v1 service (a daemon, or the in-process service of
// the node that hosts the endpoint): one Session stream for the whole job. Joins, heartbeats
// every `heartbeat_interval`, failure and success reports go up; assignments, "stop and
// re-join" and the outcome come down and are handed to the agent on its event loop.
//
// * An unreachable endpoint is retried (gRPC reconnects with backoff) until join_timeout;
//   then the job ends here with an error naming host:port.
// * A session that breaks (the service died, or the link did: keepalive notices within
//   keepalive_timeout) ends the job on this node with an error naming the endpoint.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/rendezvous/rendezvous.h"
#include "agent/snapshots/snapshot_options.h"
#include "base/security.h"
#include "rendezvous/rules/rules.h"

namespace crun::agent {

struct ServiceRendezvousOptions {
  std::string endpoint_host;  // as the user gave it (also the workers' default MASTER_ADDR)
  std::uint16_t endpoint_port = 29400;
  std::string run_id;
  std::string role = "default";
  std::string node_id;
  std::string host;  // for reports and rank order
  std::vector<std::string> addresses;
  int nproc = 1;
  std::optional<int> requested_rank;
  // The job's settings every agent of a run id must agree on (the service checks); join_timeout
  // is also how long an endpoint never reached is retried.
  rdzv::Settings settings;
  std::chrono::milliseconds heartbeat_interval{1'000};
  // How long a silent service (no answer to keepalive pings) is tolerated.
  std::chrono::milliseconds keepalive_timeout{3'000};
  // A durable service (a `crun rendezvous` daemon) that goes away: the workers stop and the
  // agent rejoins when it is back, for at most this long. A service hosted by a node's crun
  // dies with that node: losing it ends the job at once.
  std::chrono::milliseconds reconnect_timeout{60'000};
  bool virtual_local_rank = false;
  // Job token and TLS for the session (base/security.h).
  crun::Security security;
  // The node's snapshot store, sent with each heartbeat (null: nothing to say).
  std::shared_ptr<const SnapshotFacts> snapshot_facts;
};

std::unique_ptr<Rendezvous> MakeServiceRendezvous(boost::asio::io_context& io,
                                                  const ServiceRendezvousOptions& options);

}  // namespace crun::agent
