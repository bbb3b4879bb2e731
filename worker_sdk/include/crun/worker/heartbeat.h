// Heartbeats: a worker says "I made progress" (a training step done) so that crun's hang
// detection (--hang-timeout, docs/hangs.md) knows it is alive even when it prints nothing.
//
//   for (...) { TrainStep(); crun::worker::Heartbeat(); }
//
// One write() of one byte to the descriptor crun gives in CRUN_HEARTBEAT_FD; a no-op when
// crun does not watch for hangs (or without crun). Never blocks and never fails the caller:
// the descriptor is non-blocking. Thread-safe. Programs without the SDK do the same by hand:
//   Python: os.write(int(os.environ["CRUN_HEARTBEAT_FD"]), b".")
//   shell:  echo >&"$CRUN_HEARTBEAT_FD"
//
// Step(n) is a heartbeat that also tells crun the step's compute time: the time since the last
// Step() less what this process waited in the SDK's collectives meanwhile. crun compares it
// across ranks to name a slow one (docs/health.md, "Slow ranks"):
//
//   for (std::int64_t step = first; ...; ++step) { TrainStep(); crun::worker::Step(step); }
//
// The first call only starts the clock. Collectives that the host does not wait for (NCCL
// ordered on a CUDA stream, Work::BlockStream) are not subtracted: synchronise the stream, or
// Wait(), before Step() where the figure should be the device's compute.
#pragma once

#include <cstdint>

namespace crun::worker {

void Heartbeat();
void Step(std::int64_t step);

}  // namespace crun::worker
