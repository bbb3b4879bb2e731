// The time this process has spent waiting in the SDK's collectives, for Step()'s compute time
// (crun/worker/heartbeat.h): each Work's Wait() adds its own, from any thread.
#pragma once

#include <chrono>

namespace crun::worker::internal {

using StepClock = std::chrono::steady_clock;

void AddCollectiveWait(StepClock::duration waited);
StepClock::duration CollectiveWaitSoFar();

// Times one wait: from its construction to its destruction.
class CollectiveWaitTimer {
 public:
  CollectiveWaitTimer() : start_(StepClock::now()) {}
  ~CollectiveWaitTimer() { AddCollectiveWait(StepClock::now() - start_); }
  CollectiveWaitTimer(const CollectiveWaitTimer&) = delete;
  CollectiveWaitTimer& operator=(const CollectiveWaitTimer&) = delete;

 private:
  StepClock::time_point start_;
};

}  // namespace crun::worker::internal
