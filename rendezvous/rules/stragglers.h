// Slow ranks (docs/health.md, "Slow ranks"): a pure detector, fed each rank's compute time and
// answering which ranks are stragglers. No I/O, threads or clocks; the agent (for its own ranks
// on a node alone) and the service or etcd's decider (job-wide) feed it.
//
// In synchronous data-parallel training every rank runs at the same step rate, because each
// collective waits for the slowest rank: a step rate can never name the straggler. What differs
// is each rank's time per step outside the collectives, its compute time. Ranks report it in
// windows of steps: window w holds steps [w * kStepWindow, (w + 1) * kStepWindow), and a rank's
// figure for it is its mean compute time per step there. Windows are numbered by step, so the
// ranks' figures for one window are of the same steps whatever node they come from.
//
// A window is judged once every rank of the round has reported it or a later one, or, when some
// rank does not report (a worker that never calls the step API) or went quiet, once
// kMaxPendingWindows newer windows wait behind it: then with the figures it has. Each rank is
// compared with the median of the other ranks (leave-one-out, so that two ranks can name one
// another): it is over in that window when its figure is more than `ratio` times that median and
// more than `min_excess` above it (steps of a few milliseconds jitter by large ratios). A rank
// over in `windows` judged windows in a row is named; a named rank under in as many is cleared.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace crun::rdzv {

// Steps per window: what a rank reports its compute time over (the SDK and the Python module
// count steps and send one figure per window).
inline constexpr std::int64_t kStepWindow = 10;
// The last window whose steps fit an int64.
inline constexpr std::int64_t kMaxWindow = INT64_MAX / kStepWindow - 1;

struct StragglerSettings {
  double ratio = 1.5;                            // over: more than this times the others' median
  std::chrono::microseconds min_excess{10'000};  // and more than this above it
  int windows = 5;                               // judged windows in a row to name (or clear)

  Status Validate() const;
};

// One rank's figure for one window.
struct ComputeSample {
  int rank = 0;
  std::int64_t window = 0;
  std::chrono::microseconds compute{0};  // mean per step over the window
};

// A rank named a straggler, or cleared of it.
struct StragglerChange {
  int rank = 0;
  bool named = true;  // false: cleared
  double ratio = 0;   // its figure over the others' median, in the window that decided
  std::int64_t window = 0;
};

// Windows held back for ranks that do not report before they are judged without them.
inline constexpr std::size_t kMaxPendingWindows = 32;

// One round's: the owner starts a new one, with the round's world size, at each round.
// One rank's steps into its window figures: the mean compute time of a window's steps comes
// out when the first step of a later window arrives. A step that goes back (a restart from an
// older checkpoint) starts over; a repeated one is ignored.
class ComputeWindows {
 public:
  explicit ComputeWindows(int rank) : rank_(rank) {}
  std::optional<ComputeSample> Add(std::int64_t step, std::chrono::microseconds compute);

 private:
  int rank_;
  std::int64_t last_step_ = -1;
  std::int64_t window_ = -1;
  std::int64_t steps_ = 0;
  std::chrono::microseconds total_{0};
};

struct StragglerState {
  int world_size = 0;  // ranks [0, world_size) are expected; others are ignored
  // window -> rank -> figure, for windows not judged yet.
  std::map<std::int64_t, std::map<int, std::chrono::microseconds>> pending;
  std::map<int, std::int64_t> latest;  // each reporting rank's newest window
  std::int64_t judged = -1;            // the newest window judged
  std::map<int, int> over;             // windows in a row over (or, once named, under)
  std::map<int, double> named;         // the stragglers, with the ratio that named them
};

// Adds `sample` and judges every window that is complete: the changes, oldest first. A sample of
// a window already judged, from a rank that went back in steps or from a rank outside the
// round, is ignored.
std::vector<StragglerChange> OnComputeSample(StragglerState& state, const ComputeSample& sample,
                                             const StragglerSettings& settings);

// Who runs each rank of a round, from its assignments: each member's first RANK and node id,
// added in rank order (a member's ranks run to the next member's first).
class RankOwners {
 public:
  void Clear() { owners_.clear(); }
  void Add(int first_rank, std::string node_id) {
    owners_.emplace_back(first_rank, std::move(node_id));
  }
  // The node id that runs `rank`; null before the first member's ranks.
  const std::string* Of(int rank) const;

 private:
  std::vector<std::pair<int, std::string>> owners_;
};

// "rank 3: 2.4x the others' median compute time per step (steps 120-129)"; a clearing says
// "back to 1.0x".
std::string DescribeStraggler(const StragglerChange& change);
// The same without the rank: "2.4x the others' median compute time per step (steps 120-129)".
std::string DescribeSlowness(const StragglerChange& change);

}  // namespace crun::rdzv
