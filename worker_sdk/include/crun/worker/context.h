// The worker's view of its job: who it is (ranks, sizes, restart count, run id) and where the
// job's store is, read from the environment crun sets (env_names.h, docs/environment.md), plus
// a connected store client. What torch.distributed's env:// initialisation is to a Python
// script, Context::FromEnvironment is to a C++ one.
//
//   auto ctx = crun::worker::Context::FromEnvironment();
//   if (!ctx.ok()) { std::fprintf(stderr, "%s\n", ctx.status().message().c_str()); return 1; }
//   (*ctx)->env().rank, (*ctx)->store().Set("k", "v"), ...
//
// A program started without crun, or with a broken environment, gets an error naming the
// variable that is missing or malformed and its value; nothing falls back silently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "crun/rendezvous/store/store.h"

namespace crun::worker {

struct WorkerEnv {
  int rank = 0;                   // RANK: this worker in the job
  int local_rank = 0;             // LOCAL_RANK: this worker on its node
  int world_size = 1;             // WORLD_SIZE: workers in the job
  int local_world_size = 1;       // LOCAL_WORLD_SIZE: workers on this node
  int group_rank = 0;             // GROUP_RANK: this node
  int group_world_size = 1;       // GROUP_WORLD_SIZE: nodes (1 when unset)
  int restart_count = 0;          // TORCHELASTIC_RESTART_COUNT (0 when unset)
  int max_restarts = 0;           // TORCHELASTIC_MAX_RESTARTS (0 when unset)
  std::string run_id;             // TORCHELASTIC_RUN_ID ("" when unset)
  std::string master_addr;        // MASTER_ADDR: the job's store
  std::uint16_t master_port = 0;  // MASTER_PORT
};

// Looks a variable up; nullptr when unset. The default reads this process's environment.
using EnvLookup = std::function<const char*(const char*)>;

// Reads and checks the contract: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR and MASTER_PORT must be set (crun and torchrun always set them); the others
// have the defaults above. Errors name the variable and its value: "WORLD_SIZE='two' is not
// an integer", "RANK=4 is not below WORLD_SIZE=4".
StatusOr<WorkerEnv> ReadWorkerEnv(const EnvLookup& lookup = {});

struct ContextOptions {
  Millis connect_timeout{60'000};               // how long to wait for the store to accept
  Millis store_timeout = kDefaultStoreTimeout;  // for waits and replies
};

class Context {
 public:
  // Reads the environment and connects to the store at MASTER_ADDR:MASTER_PORT.
  static StatusOr<std::unique_ptr<Context>> FromEnvironment(const ContextOptions& options = {},
                                                            const EnvLookup& lookup = {});
  // Over a store the caller already has (tests, threads sharing one in-process store).
  Context(WorkerEnv env, std::shared_ptr<Store> store);

  const WorkerEnv& env() const { return env_; }
  // The job's store, as every worker of the job sees it.
  Store& store() { return *store_; }
  std::shared_ptr<Store> shared_store() { return store_; }
  // Keys under this prefix belong to this round of the job (restart count): a restarted group
  // never reads what the previous one left.
  std::string round_prefix() const;

 private:
  WorkerEnv env_;
  std::shared_ptr<Store> store_;
};

}  // namespace crun::worker
