// How long a worker that reports steps may go without progress before it is hung, told from
// the job's own step times (--hang-after-steps K, docs/hangs.md): K times the longest step that
// any local rank has taken on this node (from one step record to the next of the same worker),
// never under kStepHangFloor and never over --hang-timeout, which stays the bound. It applies
// to a worker once it has sent a step record in its attempt (imports and the state's load
// before it are watched by --hang-timeout alone) and once the node has seen kMinStepsForPace
// steps; the longest step is kept across attempts, so a slow phase seen once (an evaluation, a
// checkpoint every N steps) widens the limit for the rest of the job.
//
// Pure: step times in, limits out; HangWatch asks it on each tick.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

namespace crun::agent {

inline constexpr std::chrono::milliseconds kStepHangFloor{1000};
inline constexpr int kMinStepsForPace = 8;

class StepPace {
 public:
  using Clock = std::chrono::steady_clock;

  // factor 0: off (every limit is `bound`).
  StepPace(int factor, std::chrono::milliseconds bound) : factor_(factor), bound_(bound) {}

  // Worker `local_rank` (re)starts: its steps so far belong to another attempt.
  void Started(int local_rank) { last_.erase(local_rank); }
  // Worker `local_rank` sent a step record at `at`.
  void Stepped(int local_rank, Clock::time_point at);

  // A hang the pace declared, after `silent`: that silence counts as a step, so that a stretch
  // as long is not taken for a hang again (a spike the pace had not seen; a real hang widens
  // the limit of the next one, up to the bound).
  void Declared(std::chrono::milliseconds silent) { longest_ = std::max(longest_, silent); }

  // The silence after which worker `local_rank` is hung.
  std::chrono::milliseconds LimitFor(int local_rank) const;
  // Whether LimitFor(local_rank) is the pace's rather than the bound.
  bool Paced(int local_rank) const;

  int factor() const { return factor_; }
  std::chrono::milliseconds longest() const { return longest_; }

 private:
  int factor_;
  std::chrono::milliseconds bound_;
  std::map<int, Clock::time_point> last_;  // each worker's last step record in its attempt
  std::chrono::milliseconds longest_{0};
  int steps_ = 0;  // steps timed on this node, every attempt
};

}  // namespace crun::agent
