#include "agent/hangs/step_pace.h"

#include <algorithm>

namespace crun::agent {

void StepPace::Stepped(int local_rank, Clock::time_point at) {
  auto [it, first] = last_.try_emplace(local_rank, at);
  if (first) return;
  const auto step = std::chrono::duration_cast<std::chrono::milliseconds>(at - it->second);
  it->second = at;
  longest_ = std::max(longest_, step);
  ++steps_;
}

bool StepPace::Paced(int local_rank) const {
  return factor_ > 0 && steps_ >= kMinStepsForPace && last_.count(local_rank) != 0 &&
         std::max(factor_ * longest_, kStepHangFloor) < bound_;
}

std::chrono::milliseconds StepPace::LimitFor(int local_rank) const {
  return Paced(local_rank) ? std::max(factor_ * longest_, kStepHangFloor) : bound_;
}

}  // namespace crun::agent
