// The rendezvous load generator's etcd mode (rdzv_loadgen --etcd host:port,...): each simulated
// agent is the agent's own etcd rendezvous (agent/rendezvous/etcd_rendezvous.h: its lease, its
// node key, its watch of the run's prefix, its client), against a running etcd cluster. The
// agents live in the coordinator's shards (rdzv_loadgen.cc), which speak the same protocol as
// in the service mode; this file holds an etcd shard's body and the coordinator's own watch of
// the job document.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rendezvous/etcd/client.h"

namespace crun::bench {

struct EtcdLoad {
  std::string endpoints;  // "h:p,h:p,h:p"
  int agents = 1000;      // in the whole run (every shard's)
  int procs = 1;          // shards: shard s holds the agents i with i % procs == s
  int nproc = 8;
  int phase_timeout_ms = 120'000;
  std::string run_id = "bench";
};

// Shard `shard`'s body; the commands and replies are the service mode's (rdzv_loadgen.cc).
int RunEtcdShard(const EtcdLoad& load, int shard, int cmd_fd, int reply_fd);

// The coordinator's watch of the run's job document (a/job): how often the decider wrote it and
// how large it was. Opened before the agents form.
class JobDocWatch {
 public:
  // Null, with why on stderr, when etcd cannot be reached or the run already has keys.
  static std::unique_ptr<JobDocWatch> Open(const EtcdLoad& load);
  ~JobDocWatch();
  // Adds job_writes, job_max_bytes and job_bytes_to_watchers (every agent watches a/job) to
  // `out`, and closes the watch.
  void Record(nlohmann::json& out, int agents);

 private:
  JobDocWatch() = default;
  std::shared_ptr<etcd::Client> client_;
  std::unique_ptr<etcd::Client::Watch> watch_;
  std::mutex mu_;
  int writes_ = 0;
  std::size_t max_bytes_ = 0;
  std::size_t total_bytes_ = 0;
};

}  // namespace crun::bench
