// The Gloo backend (CPU): ranks find each other through the job's store (each publishes its
// address under the group's prefix) and talk over TCP from the interface that reaches
// MASTER_ADDR, or the one named in the options. When every rank of the group runs on one host
// (they can map one shared-memory segment), collectives go through shared memory instead,
// as NCCL does inside a node; the TCP pairs stay connected but idle.
#pragma once

#include <memory>
#include <string>

#include "crun/worker/context.h"
#include "crun/worker/process_group.h"

namespace crun::worker {

struct GlooOptions {
  // Distinguishes groups of one job: two groups may exist at once under different names.
  std::string name = "default";
  Millis timeout{300'000};  // default for every operation, and for connecting
  // The local address Gloo listens on; empty: the address this host uses to reach
  // MASTER_ADDR (so a worker never advertises loopback to other hosts).
  std::string local_address;
  // Use shared memory between ranks on one host (the default). False, or CRUN_GLOO_SHM=0 in
  // the environment, keeps every operation on TCP.
  bool shared_memory = true;
};

// Every rank of the job calls this with the same name; it returns once all are connected.
StatusOr<std::unique_ptr<ProcessGroup>> MakeGlooGroup(Context& context,
                                                      const GlooOptions& options = {});

// True when `group` (made by MakeGlooGroup) runs its collectives through shared memory.
bool GlooUsesSharedMemory(const ProcessGroup& group);

}  // namespace crun::worker
