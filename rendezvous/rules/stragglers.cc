#include "rendezvous/rules/stragglers.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include <fmt/format.h>

namespace crun::rdzv {
namespace {

// The median of `sorted` without its element at `skip`.
double MedianWithout(const std::vector<double>& sorted, std::size_t skip) {
  const std::size_t m = sorted.size() - 1;
  auto at = [&](std::size_t j) { return sorted[j < skip ? j : j + 1]; };
  return m % 2 == 1 ? at(m / 2) : (at(m / 2 - 1) + at(m / 2)) / 2;
}

void Judge(StragglerState& s, std::int64_t window,
           const std::map<int, std::chrono::microseconds>& figures, const StragglerSettings& o,
           std::vector<StragglerChange>& out) {
  s.judged = window;
  if (figures.size() < 2) return;  // nobody to compare with
  std::vector<std::pair<double, int>> by_value;
  for (const auto& [rank, compute] : figures) {
    by_value.emplace_back(static_cast<double>(compute.count()), rank);
  }
  std::sort(by_value.begin(), by_value.end());
  std::vector<double> sorted;
  for (const auto& [value, rank] : by_value) sorted.push_back(value);
  const auto min_excess = static_cast<double>(o.min_excess.count());
  for (std::size_t i = 0; i < by_value.size(); ++i) {
    const auto [value, rank] = by_value[i];
    const double median = MedianWithout(sorted, i);
    const bool over = value > o.ratio * median && value - median > min_excess;
    const double ratio = median > 0 ? value / median : 0;
    const bool named = s.named.count(rank) != 0;
    // Named: count the windows in a row under; else those over.
    int& streak = s.over[rank];
    streak = over != named ? streak + 1 : 0;
    if (streak < o.windows) continue;
    streak = 0;
    if (named) {
      s.named.erase(rank);
    } else {
      s.named[rank] = ratio;
    }
    out.push_back({rank, !named, ratio, window});
  }
}

}  // namespace

Status StragglerSettings::Validate() const {
  if (!(ratio > 1)) {
    return InvalidArgument(fmt::format("straggler ratio ({}) must be above 1", ratio));
  }
  if (min_excess.count() < 0) {
    return InvalidArgument(
        fmt::format("straggler minimum excess ({} us) must be >= 0", min_excess.count()));
  }
  if (windows < 1) {
    return InvalidArgument(fmt::format("straggler windows ({}) must be >= 1", windows));
  }
  return Status::Ok();
}

std::vector<StragglerChange> OnComputeSample(StragglerState& s, const ComputeSample& sample,
                                             const StragglerSettings& settings) {
  std::vector<StragglerChange> out;
  if (sample.window <= s.judged || sample.rank < 0 || sample.rank >= s.world_size) return out;
  // Not a figure a worker could send (it arrives from the network): windows whose steps do not
  // fit an int64, a negative time.
  if (sample.window > kMaxWindow || sample.compute.count() < 0) return out;
  auto latest = s.latest.find(sample.rank);
  if (latest != s.latest.end() && sample.window <= latest->second) return out;
  s.latest[sample.rank] = sample.window;
  s.pending[sample.window][sample.rank] = sample.compute;
  // Complete: every rank of the round is at this window or past it.
  while (!s.pending.empty()) {
    const auto oldest = s.pending.begin();
    const bool complete = static_cast<int>(s.latest.size()) == s.world_size &&
                          std::all_of(s.latest.begin(), s.latest.end(),
                                      [&](const auto& r) { return r.second >= oldest->first; });
    if (!complete && s.pending.size() <= kMaxPendingWindows) break;
    Judge(s, oldest->first, oldest->second, settings, out);
    s.pending.erase(oldest);
  }
  return out;
}

std::optional<ComputeSample> ComputeWindows::Add(std::int64_t step,
                                                 std::chrono::microseconds compute) {
  if (step == last_step_ || step < 0) return std::nullopt;
  if (step < last_step_) {
    window_ = -1;
    steps_ = 0;
    total_ = {};
  }
  last_step_ = step;
  std::optional<ComputeSample> done;
  const std::int64_t window = step / kStepWindow;
  if (window != window_) {
    if (steps_ > 0) done = ComputeSample{rank_, window_, total_ / steps_};
    window_ = window;
    steps_ = 0;
    total_ = {};
  }
  ++steps_;
  total_ += compute;
  return done;
}

const std::string* RankOwners::Of(int rank) const {
  auto after = std::upper_bound(owners_.begin(), owners_.end(), rank,
                                [](int r, const auto& owner) { return r < owner.first; });
  if (after == owners_.begin()) return nullptr;
  return &std::prev(after)->second;
}

std::string DescribeSlowness(const StragglerChange& c) {
  const std::int64_t first = c.window * kStepWindow;
  return fmt::format("{}{:.1f}x the others' median compute time per step (steps {}-{})",
                     c.named ? "" : "back to ", c.ratio, first, first + kStepWindow - 1);
}

std::string DescribeStraggler(const StragglerChange& c) {
  return fmt::format("rank {}: {}", c.rank, DescribeSlowness(c));
}

}  // namespace crun::rdzv
