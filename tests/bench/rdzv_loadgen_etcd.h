// The rendezvous load generator's etcd mode (rdzv_loadgen --etcd host:port,...): N agents,
// each the agent's own etcd rendezvous (agent/rendezvous/etcd_rendezvous.h: its lease, its node
// key, its watch of the run's prefix, its client), in this one process, against a running etcd
// cluster.
// Phases as in the service mode: form, steady, failure -> everyone re-assigned, finish.
#pragma once

#include <string>
#include <vector>

namespace crun::bench {

struct EtcdLoad {
  std::string endpoints;  // "h:p,h:p,h:p"
  int agents = 1000;
  int nproc = 8;
  int steady_ms = 3000;
  int phase_timeout_ms = 120'000;
  std::vector<int> service_pids;  // etcd's members: their CPU and RSS are summed
  std::string run_id = "bench";
};

// Prints one JSON object; 0 when every phase completed for every agent.
int RunEtcdLoad(const EtcdLoad& load);

}  // namespace crun::bench
