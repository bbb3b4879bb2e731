// The worker environment of rank `rank` in a one-node job of `world` ranks, for SDK tests that
// run ranks as threads over an in-process store (MASTER_* are never dialled there).
#pragma once

#include <string>

#include "crun/worker/context.h"

inline crun::worker::WorkerEnv TestWorkerEnv(int rank, int world, std::string run_id) {
  crun::worker::WorkerEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.local_world_size = world;
  e.run_id = std::move(run_id);
  e.master_addr = "127.0.0.1";
  e.master_port = 1;
  return e;
}
