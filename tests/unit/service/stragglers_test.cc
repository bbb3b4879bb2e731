// The slow-rank detector (rendezvous/rules/stragglers.h) as tables and seeded random runs:
// figures in, names out. Who is named and in which window, never how long anything took.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "rendezvous/rules/stragglers.h"

namespace {

using namespace std::chrono_literals;
using crun::rdzv::ComputeSample;
using crun::rdzv::DescribeStraggler;
using crun::rdzv::OnComputeSample;
using crun::rdzv::StragglerChange;
using crun::rdzv::StragglerSettings;
using crun::rdzv::StragglerState;
using Us = std::chrono::microseconds;

StragglerState Round(int world_size) {
  StragglerState s;
  s.world_size = world_size;
  return s;
}

// Feeds window `w` for every rank, figures from `figure(rank, w)`, in rank order.
template <class Figure>
std::vector<StragglerChange> Window(StragglerState& s, int ranks, std::int64_t w, Figure figure,
                                    const StragglerSettings& o = {}) {
  std::vector<StragglerChange> out;
  for (int r = 0; r < ranks; ++r) {
    auto c = OnComputeSample(s, ComputeSample{r, w, figure(r, w)}, o);
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

TEST_CASE("stragglers: a slow rank is named in its 5th window over, the others never",
          "[stragglers]") {
  for (int ranks : {2, 3, 4, 8, 64}) {
    INFO(ranks << " ranks");
    StragglerState s = Round(ranks);
    const int slow = ranks - 1;
    for (std::int64_t w = 0; w < 20; ++w) {
      auto changes = Window(s, ranks, w, [&](int r, std::int64_t window) {
        return r == slow && window >= 6 ? Us(200'000) : Us(100'000);
      });
      if (w == 10) {  // windows 6, 7, 8, 9, 10: five in a row over
        REQUIRE(changes.size() == 1);
        CHECK(changes[0].rank == slow);
        CHECK(changes[0].named);
        CHECK(changes[0].ratio == Approx(2.0));
        CHECK(DescribeStraggler(changes[0]) ==
              "rank " + std::to_string(slow) +
                  ": 2.0x the others' median compute time per step (steps 100-109)");
      } else {
        CHECK(changes.empty());
      }
    }
    CHECK(s.named.size() == 1);
  }
}

TEST_CASE("stragglers: what is not slow enough, or not for long enough", "[stragglers]") {
  struct Row {
    const char* what;
    Us fast, slow;
    int windows_slow;  // then fast again
    bool named;
  };
  const Row rows[] = {
      {"twice as slow", 100ms, 200ms, 5, true},
      {"4 windows only", 100ms, 200ms, 4, false},
      {"1.4x", 100ms, 140ms, 20, false},
      {"1.6x", 100ms, 160ms, 5, true},
      {"tiny steps: 3x but 2 ms above", 1ms, 3ms, 20, false},
      {"1.5x exactly, 10 ms above", 20ms, 30ms, 20, false},  // neither is more than
      {"1.6x, but 6 ms above", 10ms, 16ms, 20, false},
      {"past both", 20ms, 31ms, 5, true},
  };
  for (const Row& r : rows) {
    INFO(r.what);
    StragglerState s = Round(4);
    int named = 0;
    for (std::int64_t w = 0; w < 30; ++w) {
      for (const auto& c : Window(s, 4, w, [&](int rank, std::int64_t window) {
             return rank == 2 && window < r.windows_slow ? r.slow : r.fast;
           })) {
        named += c.named ? 1 : 0;
      }
    }
    CHECK(named == (r.named ? 1 : 0));
  }
}

TEST_CASE("stragglers: a named rank is cleared after 5 windows back at speed", "[stragglers]") {
  StragglerState s = Round(3);
  std::vector<std::pair<std::int64_t, bool>> seen;
  for (std::int64_t w = 0; w < 30; ++w) {
    for (const auto& c : Window(s, 3, w, [](int rank, std::int64_t window) {
           return rank == 0 && window < 8 ? Us(300'000) : Us(100'000);
         })) {
      CHECK(c.rank == 0);
      seen.emplace_back(c.window, c.named);
      if (!c.named) CHECK_THAT(DescribeStraggler(c), Catch::Contains("back to 1.0x"));
    }
  }
  CHECK(seen == std::vector<std::pair<std::int64_t, bool>>{{4, true}, {12, false}});
  CHECK(s.named.empty());
}

TEST_CASE("stragglers: samples in any order name the same rank in the same window",
          "[stragglers]") {
  // Each rank reports its windows in order; ranks run up to a window apart, and nodes' reports
  // interleave: a random merge of the ranks' sequences within that.
  constexpr int kRanks = 6;
  for (unsigned seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    std::vector<std::int64_t> next(kRanks, 0);
    std::vector<ComputeSample> samples;
    while (samples.size() < 24 * kRanks) {
      const std::int64_t slowest = *std::min_element(next.begin(), next.end());
      std::vector<int> ready;
      for (int r = 0; r < kRanks; ++r) {
        if (next[r] < 24 && next[r] <= slowest + 1) ready.push_back(r);
      }
      const int r = ready[std::uniform_int_distribution<std::size_t>(0, ready.size() - 1)(rng)];
      const std::int64_t w = next[r]++;
      samples.push_back({r, w, r == 4 && w >= 3 ? Us(250'000) : Us(100'000)});
    }
    StragglerState s = Round(kRanks);
    std::vector<StragglerChange> changes;
    for (const auto& sample : samples) {
      for (const auto& c : OnComputeSample(s, sample, {})) changes.push_back(c);
    }
    INFO("seed " << seed);
    REQUIRE(changes.size() == 1);
    CHECK(changes[0].rank == 4);
    CHECK(changes[0].window == 7);
  }
}

TEST_CASE("stragglers: healthy ranks with +-30% jitter never trip the defaults", "[stragglers]") {
  // Every rank's window figure jitters independently, far more than a mean over 10 steps does.
  for (int ranks : {2, 3, 8, 128}) {
    INFO(ranks << " ranks");
    std::mt19937 rng(static_cast<unsigned>(ranks));
    std::uniform_real_distribution<double> jitter(0.7, 1.3);
    StragglerState s = Round(ranks);
    std::size_t changes = 0;
    for (std::int64_t w = 0; w < 2000; ++w) {
      changes += Window(s, ranks, w, [&](int, std::int64_t) {
                   return Us(static_cast<std::int64_t>(100'000 * jitter(rng)));
                 }).size();
    }
    CHECK(changes == 0);
  }
}

TEST_CASE("stragglers: a rank that does not report holds judgement back 32 windows, no more",
          "[stragglers]") {
  StragglerState s = Round(3);
  std::vector<StragglerChange> changes;
  auto feed = [&](int rank, std::int64_t w) {
    for (const auto& c :
         OnComputeSample(s, ComputeSample{rank, w, rank == 2 ? Us(300'000) : Us(100'000)}, {})) {
      changes.push_back(c);
    }
  };
  for (std::int64_t w = 0; w < 100; ++w) {
    for (int r = 0; r < 3; ++r) {
      if (r != 0 || w < 2) feed(r, w);  // rank 0's worker stopped stepping after window 1
    }
  }
  REQUIRE(changes.size() == 1);  // judged with ranks 1 and 2 alone
  CHECK(changes[0].rank == 2);
  CHECK(changes[0].window == 4);
  CHECK(s.pending.size() == crun::rdzv::kMaxPendingWindows);
  CHECK(s.judged == 99 - static_cast<std::int64_t>(crun::rdzv::kMaxPendingWindows));
  // Late, repeated or stray figures change nothing.
  CHECK(OnComputeSample(s, ComputeSample{1, 5, Us(1)}, {}).empty());
  CHECK(OnComputeSample(s, ComputeSample{0, 1, Us(1)}, {}).empty());
  CHECK(OnComputeSample(s, ComputeSample{3, 99, Us(1)}, {}).empty());  // not in the round
  CHECK(s.judged == 99 - static_cast<std::int64_t>(crun::rdzv::kMaxPendingWindows));
  // Back: every held window is complete at once.
  feed(0, 99);
  CHECK(s.pending.empty());
  CHECK(s.judged == 99);
}

TEST_CASE("stragglers: a rank's steps become one figure per window", "[stragglers]") {
  crun::rdzv::ComputeWindows w(3);
  std::vector<ComputeSample> out;
  auto add = [&](std::int64_t step, Us compute) {
    if (auto s = w.Add(step, compute)) out.push_back(*s);
  };
  for (std::int64_t step = 5; step < 30; ++step) add(step, Us(step < 10 ? 100 : 200));
  add(29, Us(999'999));      // repeated: ignored
  REQUIRE(out.size() == 2);  // windows 0 (steps 5-9, joined late) and 1; 2 is still open
  CHECK(out[0].rank == 3);
  CHECK(out[0].window == 0);
  CHECK(out[0].compute == Us(100));
  CHECK(out[1].window == 1);
  CHECK(out[1].compute == Us(200));
  // A restart from step 12's checkpoint: window 2's steps so far are dropped, not mixed in.
  add(12, Us(50));
  add(25, Us(70));
  REQUIRE(out.size() == 3);
  CHECK(out[2].window == 1);
  CHECK(out[2].compute == Us(50));
}

TEST_CASE("stragglers: settings are checked with the value named", "[stragglers]") {
  StragglerSettings o;
  CHECK(o.Validate().ok());
  o.ratio = 1;
  CHECK_THAT(o.Validate().message(), Catch::Contains("straggler ratio (1) must be above 1"));
  o = {};
  o.windows = 0;
  CHECK_THAT(o.Validate().message(), Catch::Contains("straggler windows (0) must be >= 1"));
  o = {};
  o.min_excess = Us(-1);
  CHECK_THAT(o.Validate().message(), Catch::Contains("(-1 us) must be >= 0"));
}

}  // namespace

TEST_CASE("stragglers: figures no worker could send are ignored", "[stragglers]") {
  // They come from the network (a heartbeat to the service): ranks outside the round, windows
  // before the first or past the last whose steps fit an int64, a negative time.
  auto s = Round(2);
  const ComputeSample bad[] = {{-1, 0, Us(1)},        {2, 0, Us(1)},
                               {0, -3, Us(1)},        {0, crun::rdzv::kMaxWindow + 1, Us(1)},
                               {0, INT64_MAX, Us(1)}, {1, 0, Us(-5)}};
  for (const auto& figure : bad) {
    CHECK(OnComputeSample(s, figure, {}).empty());
    CHECK(s.latest.empty());
    CHECK(s.pending.empty());
  }
  // The last window is a window like any other: named there, its steps said without overflow.
  auto t = Round(2);
  std::vector<StragglerChange> named;
  for (std::int64_t w = crun::rdzv::kMaxWindow - 4; w <= crun::rdzv::kMaxWindow; ++w) {
    auto c = Window(t, 2, w, [](int r, std::int64_t) { return Us(r == 0 ? 90'000 : 20'000); });
    named.insert(named.end(), c.begin(), c.end());
  }
  REQUIRE(named.size() == 1);
  CHECK(named[0].rank == 0);
  CHECK(named[0].window == crun::rdzv::kMaxWindow);
  CHECK(DescribeStraggler(named[0]) ==
        "rank 0: 4.5x the others' median compute time per step "
        "(steps 9223372036854775790-9223372036854775799)");
}
