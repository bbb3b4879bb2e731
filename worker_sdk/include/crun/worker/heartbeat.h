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
#pragma once

namespace crun::worker {

void Heartbeat();

}  // namespace crun::worker
