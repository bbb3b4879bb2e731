// Gloo process groups as threads over one in-process store: every collective and dtype, world
// sizes 2 to 4 (including 3), two groups at once, and a rank that stops taking part making the
// others fail within the timeout instead of hanging. Every case runs on both transports: the
// shared-memory channel (the default between ranks of one host) and Gloo's TCP pairs on
// loopback.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "crun/worker/gloo.h"
#include "rendezvous/store/memory_store.h"
#include "tests/unit/worker/test_env.h"
#include "worker_sdk/src/half.h"

// Catch2 assertions are not thread-safe: the rank threads assert under one lock, and never
// with REQUIRE (its exception would end a thread, not the test).
std::mutex catch_mu;
#define T_CHECK(...)                          \
  do {                                        \
    std::lock_guard<std::mutex> l_(catch_mu); \
    CHECK(__VA_ARGS__);                       \
  } while (0)
#define T_CHECK_THAT(arg, matcher)            \
  do {                                        \
    std::lock_guard<std::mutex> l_(catch_mu); \
    CHECK_THAT(arg, matcher);                 \
  } while (0)
#define T_OK(expr)                            \
  do {                                        \
    const crun::Status s_ = (expr);           \
    std::lock_guard<std::mutex> l_(catch_mu); \
    INFO(s_.message());                       \
    CHECK(s_.ok());                           \
  } while (0)
#define T_FAIL(msg)                           \
  do {                                        \
    std::lock_guard<std::mutex> l_(catch_mu); \
    FAIL_CHECK(msg);                          \
  } while (0)

namespace {

using namespace std::chrono_literals;

// A latch whose waits end at a deadline: a rank that never arrives fails the case instead of
// hanging it.
class Gate {
 public:
  explicit Gate(int count) : count_(count) {}
  void CountDown() {
    std::lock_guard<std::mutex> l(mu_);
    if (--count_ <= 0) cv_.notify_all();
  }
  // Whether every rank arrived within `limit`; a test failure if not.
  bool Wait(std::chrono::milliseconds limit = 120s) {
    std::unique_lock<std::mutex> l(mu_);
    if (cv_.wait_for(l, limit, [&] { return count_ <= 0; })) return true;
    l.unlock();
    T_FAIL("a gate was not passed within " << limit.count() << " ms: a rank never arrived");
    return false;
  }
  bool ArriveAndWait() {
    CountDown();
    return Wait();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
};
using crun::worker::DType;
using crun::worker::ProcessGroup;
using crun::worker::ReduceOp;

crun::worker::WorkerEnv EnvFor(int rank, int world) {
  return TestWorkerEnv(rank, world, "gloo-test");
}

// The transport the current case runs on; each TEST_CASE sets it with TRANSPORTS().
bool use_shm = true;
#define TRANSPORTS()               \
  use_shm = GENERATE(true, false); \
  INFO((use_shm ? "shared memory" : "tcp"))

// Runs `body(rank, group)` on `world` threads, each with its own group named `name`. No body
// starts before every rank has finished forming its group, so a body that leaves at once (a
// rank that exits) cannot break another rank's formation.
void OnRanks(int world, const std::function<void(int, ProcessGroup&)>& body,
             const std::string& name = "default", crun::Millis timeout = 30s) {
  auto store = std::make_shared<crun::MemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  Gate formed(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      crun::worker::Context ctx(EnvFor(r, world), store);
      crun::worker::GlooOptions o;
      o.name = name;
      o.timeout = timeout;
      o.shared_memory = use_shm;
      auto group = crun::worker::MakeGlooGroup(ctx, o);
      formed.ArriveAndWait();
      if (!group.ok()) {
        errors[static_cast<std::size_t>(r)] = group.status().message();
        return;
      }
      // Threads of one process always share memory: the channel is used exactly when asked.
      T_CHECK(crun::worker::GlooUsesSharedMemory(**group) == (use_shm && world > 1));
      body(r, **group);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) T_CHECK(e.empty());
}

template <typename T>
std::vector<T> Values(int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<T>((rank + 1) * 10 + static_cast<int>(i % 7));
  return v;
}

}  // namespace

TEST_CASE("gloo allreduce: every op on float32, float64, int32, int64", "[gloo]") {
  TRANSPORTS();
  for (int world : {2, 3, 4}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{300'001}}) {
      std::vector<std::vector<double>> got(static_cast<std::size_t>(world) * 8);
      OnRanks(world, [&](int rank, ProcessGroup& g) {
        auto f32 = Values<float>(rank, n);
        auto f64 = Values<double>(rank, n);
        auto i32 = Values<std::int32_t>(rank, n);
        auto i64 = Values<std::int64_t>(rank, n);
        auto f32avg = Values<float>(rank, n);
        auto i32min = Values<std::int32_t>(rank, n);
        auto i64max = Values<std::int64_t>(rank, n);
        auto f64min = Values<double>(rank, n);
        T_OK(g.AllReduce(f32.data(), n, DType::kFloat32, ReduceOp::kSum));
        T_OK(g.AllReduce(f64.data(), n, DType::kFloat64, ReduceOp::kSum));
        T_OK(g.AllReduce(i32.data(), n, DType::kInt32, ReduceOp::kSum));
        T_OK(g.AllReduce(i64.data(), n, DType::kInt64, ReduceOp::kSum));
        T_OK(g.AllReduce(f32avg.data(), n, DType::kFloat32, ReduceOp::kAvg));
        T_OK(g.AllReduce(i32min.data(), n, DType::kInt32, ReduceOp::kMin));
        T_OK(g.AllReduce(i64max.data(), n, DType::kInt64, ReduceOp::kMax));
        T_OK(g.AllReduce(f64min.data(), n, DType::kFloat64, ReduceOp::kMin));
        for (std::size_t i = 0; i < n; ++i) {
          const double k = static_cast<double>(i % 7);
          const double sum = 10.0 * world * (world + 1) / 2 + world * k;
          if (f32[i] != static_cast<float>(sum) || f64[i] != sum ||
              i32[i] != static_cast<std::int32_t>(sum) ||
              i64[i] != static_cast<std::int64_t>(sum) ||
              std::abs(f32avg[i] - static_cast<float>(sum / world)) > 1e-4f ||
              i32min[i] != static_cast<std::int32_t>(10 + k) ||
              i64max[i] != static_cast<std::int64_t>(10 * world + k) || f64min[i] != 10 + k) {
            T_FAIL("rank " << rank << " index " << i << " of " << n << " in world " << world);
          }
        }
      });
    }
  }
}

TEST_CASE("gloo allreduce on float16 and bfloat16 reduces in float32", "[gloo]") {
  TRANSPORTS();
  using crun::worker::BFloat16ToFloat;
  using crun::worker::FloatToBFloat16;
  using crun::worker::FloatToHalf;
  using crun::worker::HalfToFloat;
  const std::size_t n = 4097;
  OnRanks(3, [&](int rank, ProcessGroup& g) {
    std::vector<std::uint16_t> h(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      h[i] = FloatToHalf(0.5f * static_cast<float>(rank + 1));
      b[i] = FloatToBFloat16(static_cast<float>(rank + 1) * static_cast<float>(i % 5));
    }
    T_OK(g.AllReduce(h.data(), n, DType::kFloat16, ReduceOp::kSum));
    T_OK(g.AllReduce(b.data(), n, DType::kBFloat16, ReduceOp::kMax));
    for (std::size_t i = 0; i < n; ++i) {
      T_CHECK(HalfToFloat(h[i]) == 3.0f);  // 0.5 + 1 + 1.5
      T_CHECK(BFloat16ToFloat(b[i]) == 3.0f * static_cast<float>(i % 5));
    }
  });
}

TEST_CASE("gloo broadcast, allgather and barrier", "[gloo]") {
  TRANSPORTS();
  OnRanks(3, [&](int rank, ProcessGroup& g) {
    std::vector<double> v(5000, rank == 2 ? 7.5 : -1.0);
    T_OK(g.Broadcast(v.data(), v.size(), DType::kFloat64, 2));
    for (double x : v) T_CHECK(x == 7.5);
    std::vector<std::int64_t> mine(3, rank), all(9, -1);
    T_OK(g.AllGather(mine.data(), all.data(), 3, DType::kInt64));
    T_CHECK(all == std::vector<std::int64_t>{0, 0, 0, 1, 1, 1, 2, 2, 2});
    T_OK(g.Barrier());
    T_CHECK(g.Broadcast(v.data(), 1, DType::kFloat64, 3).code() ==
            crun::StatusCode::kInvalidArgument);
  });
}

TEST_CASE("collectives larger than a shared-memory slot, back to back", "[gloo]") {
  TRANSPORTS();
  // Several chunks each (a slot is 1 MiB), one collective straight after another, values
  // changing every round: a rank refilling its slot while a slower one still reads it would
  // show here as wrong numbers.
  OnRanks(3, [&](int rank, ProcessGroup& g) {
    const std::size_t n = 700'001;  // 2.8 MB of float32, not a multiple of anything
    for (int round = 0; round < 6; ++round) {
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; ++i)
        x[i] = static_cast<float>((rank + round) * 4 + static_cast<int>(i % 3));
      T_OK(g.AllReduce(x.data(), n, DType::kFloat32, ReduceOp::kSum));
      std::vector<std::int32_t> mine(n / 2, rank * 100 + round), all(3 * (n / 2), -1);
      T_OK(g.AllGather(mine.data(), all.data(), n / 2, DType::kInt32));
      std::vector<double> b(n / 2 + 3, rank == round % 3 ? round + 0.5 : -1.0);
      T_OK(g.Broadcast(b.data(), b.size(), DType::kFloat64, round % 3));
      std::vector<float> rs_in(3 * (n / 3)), rs_out(n / 3);
      for (std::size_t i = 0; i < rs_in.size(); ++i)
        rs_in[i] = static_cast<float>(rank + round + static_cast<int>(i % 5));
      T_OK(g.ReduceScatter(rs_in.data(), rs_out.data(), n / 3, DType::kFloat32, ReduceOp::kMax));
      bool good = true;
      for (std::size_t i = 0; i < n && good; ++i) {
        good = x[i] == static_cast<float>(4 * (3 * round + 3) + 3 * static_cast<int>(i % 3));
      }
      for (std::size_t i = 0; i < all.size() && good; ++i) {
        good = all[i] == static_cast<std::int32_t>(i / (n / 2)) * 100 + round;
      }
      for (std::size_t i = 0; i < b.size() && good; ++i) good = b[i] == round + 0.5;
      for (std::size_t i = 0; i < rs_out.size() && good; ++i) {
        const std::size_t j = static_cast<std::size_t>(rank) * (n / 3) + i;
        good = rs_out[i] == static_cast<float>(2 + round + static_cast<int>(j % 5));
      }
      if (!good) T_FAIL("rank " << rank << " round " << round << ": wrong values");
    }
  });
}

TEST_CASE("gloo avg on integers is refused, naming the dtype", "[gloo]") {
  TRANSPORTS();
  OnRanks(2, [&](int, ProcessGroup& g) {
    std::int32_t x = 1;
    auto s = g.AllReduce(&x, 1, DType::kInt32, ReduceOp::kAvg);
    T_CHECK(s.code() == crun::StatusCode::kInvalidArgument);
    T_CHECK_THAT(s.message(), Catch::Contains("avg needs a floating dtype, not int32"));
  });
}

TEST_CASE("two gloo groups of one job work at once", "[gloo]") {
  TRANSPORTS();
  auto store = std::make_shared<crun::MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      crun::worker::Context ctx(EnvFor(r, 2), store);
      crun::worker::GlooOptions a, b;
      a.name = "grads";
      b.name = "metrics";
      a.shared_memory = b.shared_memory = use_shm;
      auto ga = crun::worker::MakeGlooGroup(ctx, a);
      auto gb = crun::worker::MakeGlooGroup(ctx, b);
      T_CHECK(ga.ok());
      T_CHECK(gb.ok());
      if (!ga.ok() || !gb.ok()) return;
      float x = static_cast<float>(r + 1), y = static_cast<float>(10 * (r + 1));
      T_OK((*ga)->AllReduce(&x, 1, DType::kFloat32, ReduceOp::kSum));
      T_OK((*gb)->AllReduce(&y, 1, DType::kFloat32, ReduceOp::kMax));
      T_CHECK(x == 3.0f);
      T_CHECK(y == 20.0f);
    });
  }
  for (auto& t : threads) t.join();
}

TEST_CASE("gloo reduce-scatter: every op, dtypes, world sizes 1 to 5", "[gloo]") {
  TRANSPORTS();
  for (int world : {1, 2, 3, 5}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{777}, std::size_t{100'003}}) {
      OnRanks(world, [&](int rank, ProcessGroup& g) {
        const std::size_t total = n * static_cast<std::size_t>(world);
        // Element j of rank q's input is q + j % 11, so block r's sum at offset i is
        // sum_q (q + (r*n + i) % 11).
        std::vector<float> f32(total);
        std::vector<std::int64_t> i64(total);
        std::vector<double> f64(total);
        for (std::size_t j = 0; j < total; ++j) {
          f32[j] = static_cast<float>(rank) + static_cast<float>(j % 11);
          i64[j] = rank + static_cast<std::int64_t>(j % 11);
          f64[j] = f32[j];
        }
        std::vector<float> sum(n), avg(n);
        std::vector<std::int64_t> mx(n);
        std::vector<double> mn(n);
        T_OK(g.ReduceScatter(f32.data(), sum.data(), n, DType::kFloat32, ReduceOp::kSum));
        T_OK(g.ReduceScatter(f32.data(), avg.data(), n, DType::kFloat32, ReduceOp::kAvg));
        T_OK(g.ReduceScatter(i64.data(), mx.data(), n, DType::kInt64, ReduceOp::kMax));
        T_OK(g.ReduceScatter(f64.data(), mn.data(), n, DType::kFloat64, ReduceOp::kMin));
        const double ranks = world * (world - 1) / 2.0;
        for (std::size_t i = 0; i < n; ++i) {
          const double k = static_cast<double>((static_cast<std::size_t>(rank) * n + i) % 11);
          if (sum[i] != static_cast<float>(ranks + world * k) ||
              std::abs(avg[i] - static_cast<float>((ranks + world * k) / world)) > 1e-4f ||
              mx[i] != static_cast<std::int64_t>(world - 1 + k) || mn[i] != k) {
            T_FAIL("rank " << rank << " index " << i << " of " << n << " in world " << world);
            break;
          }
        }
      });
    }
  }
}

TEST_CASE("gloo reduce-scatter of bfloat16 reduces in float32", "[gloo]") {
  TRANSPORTS();
  using crun::worker::BFloat16ToFloat;
  using crun::worker::FloatToBFloat16;
  OnRanks(4, [&](int rank, ProcessGroup& g) {
    std::vector<std::uint16_t> in(4 * 1000, FloatToBFloat16(0.25f * static_cast<float>(rank)));
    std::vector<std::uint16_t> out(1000);
    T_OK(g.ReduceScatter(in.data(), out.data(), 1000, DType::kBFloat16, ReduceOp::kSum));
    for (auto v : out) T_CHECK(BFloat16ToFloat(v) == 1.5f);  // 0 + .25 + .5 + .75
  });
}

TEST_CASE("async operations complete in the order issued, and test() tells when", "[gloo]") {
  TRANSPORTS();
  OnRanks(3, [&](int rank, ProcessGroup& g) {
    // Each allreduce depends on the previous one's result: any reordering gives other numbers.
    std::vector<double> x(50'000, 1.0);
    std::vector<crun::worker::WorkPtr> works;
    for (int i = 0; i < 4; ++i) {
      works.push_back(
          g.AllReduceAsync(x.data(), x.size(), DType::kFloat64, ReduceOp::kSum, g.timeout()));
    }
    std::vector<std::int32_t> gathered(3, -1);
    const std::int32_t me = rank;
    auto gather = g.AllGatherAsync(&me, gathered.data(), 1, DType::kInt32, g.timeout());
    T_OK(gather->Wait());
    // The allgather ran after every allreduce: they are all finished by now.
    for (auto& w : works) T_CHECK(w->Test());
    for (auto& w : works) T_OK(w->Wait());
    T_CHECK(x.front() == 81.0);  // 3^4
    T_CHECK(x.back() == 81.0);
    T_CHECK(gathered == std::vector<std::int32_t>{0, 1, 2});
    T_CHECK(gather->Test());
    T_OK(gather->Wait());  // a second wait returns the same status
  });
}

TEST_CASE("abort: the aborting rank's work and its peers fail at once", "[gloo]") {
  TRANSPORTS();
  Gate peer_waiting(1);
  std::vector<crun::Status> results(2);
  OnRanks(
      2,
      [&](int rank, ProcessGroup& g) {
        float x = 1;
        if (rank == 0) {
          // Rank 1 has not joined: this allreduce cannot finish before its timeout. Over
          // shared memory Abort() ends it at once, even when it is in flight; over TCP it may
          // already be inside Gloo, which lets go only at the timeout (process_group.h), so
          // that one is short there.
          const auto stuck_timeout = use_shm ? crun::Millis(60s) : crun::Millis(3s);
          auto stuck = g.AllReduceAsync(&x, 1, DType::kFloat32, ReduceOp::kSum, stuck_timeout);
          auto queued = g.BarrierAsync(60s);
          g.Abort("the trainer gave up");
          results[0] = stuck->Wait();
          T_CHECK(queued->Wait().code() == crun::StatusCode::kAborted);
          peer_waiting.CountDown();
        } else {
          peer_waiting.Wait();
          results[1] = g.AllReduce(&x, 1, DType::kFloat32, ReduceOp::kSum, 60s);
        }
      },
      "abortable");
  INFO(results[0].message());
  CHECK(results[0].code() == crun::StatusCode::kAborted);
  CHECK_THAT(results[0].message(),
             Catch::Contains("gloo group 'abortable', rank 0 of 2: allreduce of 1 float32 "
                             "(sum): aborted: the trainer gave up"));
  INFO(results[1].message());
  CHECK(results[1].code() == crun::StatusCode::kUnavailable);
}

// Rank 2 of 3 holds its group open but never joins the allreduce (a hung worker), or leaves
// (a dead one): the others return within the timeout, saying which operation and rank. The
// first rank to fail closes its connections, so the other may learn of it from that instead
// of from its own timer: a hung rank gives at least one timeout, a dead one none.
void CheckStalled(bool rank2_exits) {
  std::vector<crun::Status> results(3);
  Gate others_done(2);
  OnRanks(
      3,
      [&](int rank, ProcessGroup& g) {
        if (rank == 2) {
          if (!rank2_exits) others_done.Wait();  // hung: connected, but silent
          return;
        }
        float x = 1;
        results[static_cast<std::size_t>(rank)] =
            g.AllReduce(&x, 1, DType::kFloat32, ReduceOp::kSum, 500ms);
        // The group is broken now: the next call fails at once, saying why.
        auto again = g.Barrier();
        T_CHECK(!again.ok());
        T_CHECK_THAT(again.message(), Catch::Contains("broken by an earlier error"));
        others_done.CountDown();
      },
      "stall");
  int timeouts = 0;
  for (int r = 0; r < 2; ++r) {
    const auto& s = results[static_cast<std::size_t>(r)];
    INFO(s.message());
    CHECK((s.code() == crun::StatusCode::kTimeout || s.code() == crun::StatusCode::kUnavailable));
    if (s.code() == crun::StatusCode::kTimeout) ++timeouts;
    CHECK_THAT(s.message(), Catch::StartsWith("gloo group 'stall', rank " + std::to_string(r) +
                                              " of 3: allreduce of 1 float32 (sum)"));
  }
  if (rank2_exits) {
    CHECK(timeouts == 0);
  } else {
    CHECK(timeouts >= 1);
  }
}

TEST_CASE("a hung rank makes the others time out, not hang", "[gloo]") {
  TRANSPORTS();
  CheckStalled(false);
}

TEST_CASE("a rank that exits makes the others fail at once, naming the peer", "[gloo]") {
  TRANSPORTS();
  CheckStalled(true);
}
