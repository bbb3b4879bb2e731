// The NCCL backend (GPU): rank 0 creates the communicator's unique id and publishes it in the
// job's store under the group's per-round key; every rank joins with it on its own GPU and
// gets one communicator and one CUDA stream per group.
//
// Buffers are device memory on the group's GPU. Operations are queued on the group's stream
// in the order issued (issue them from one thread); a Work's Wait() blocks the calling host
// thread until the operation is done on the GPU. A deadline passing, an asynchronous NCCL
// error or Abort() calls ncclCommAbort, so nothing stays stuck on the GPU either; errors carry
// NCCL's own text.
#pragma once

#include <memory>
#include <string>

#include "crun/worker/context.h"
#include "crun/worker/process_group.h"

namespace crun::worker {

struct NcclOptions {
  // Distinguishes groups of one job: two groups may exist at once under different names.
  std::string name = "default";
  Millis timeout{300'000};  // default for every operation, and for creating the communicator
  // The CUDA device; -1: LOCAL_RANK modulo the number of visible devices.
  int device = -1;
};

// Every rank of the job calls this with the same name; it returns once the communicator is
// ready. Fails naming the rank and the CUDA or NCCL error (no GPU visible included).
StatusOr<std::unique_ptr<ProcessGroup>> MakeNcclGroup(Context& context,
                                                      const NcclOptions& options = {});

// NCCL's version as "2.28.9", from the library actually loaded.
std::string NcclVersion();

}  // namespace crun::worker
