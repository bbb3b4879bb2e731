// A crun worker built on the SDK's Gloo backend, for the process-level tests
// (tests/integration/test_worker_sdk.py). Each rank writes OUT_DIR/rank<R>.json.
//
//   gloo_worker check OUT_DIR MAX_BYTES
//     Every collective and dtype from one element up to MAX_BYTES, verified element by
//     element, and two groups working at the same time. Exit 0 when every result is right.
//   gloo_worker bench OUT_DIR SIZES_BYTES
//     Allreduce (float32, sum) timing for each comma-separated size: rank 0 writes
//     OUT_DIR/bench.json with the median seconds per size (tests/bench/allreduce_bench.py).
//   gloo_worker die OUT_DIR VICTIM kill|hang TIMEOUT_MS
//     Every rank starts a 64 MiB allreduce; rank VICTIM dies (SIGKILL) or hangs (SIGSTOP) once
//     the others have started theirs. The survivors record what their allreduce returned and
//     how long it took, and exit 0 when it failed with a status naming the operation.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "crun/worker/context.h"
#include "crun/worker/gloo.h"
#include "tests/workers/json_report.h"
#include "worker_sdk/src/half.h"

namespace {

using crun::worker::DType;
using crun::worker::ProcessGroup;
using crun::worker::ReduceOp;
using Clock = std::chrono::steady_clock;

struct Failure {
  std::string what;
};

void Require(const crun::Status& s, const std::string& what) {
  if (!s.ok()) throw Failure{what + ": " + s.ToString()};
}

void WriteReport(const std::string& dir, int rank, const nlohmann::json& report) {
  WriteJsonReport(dir + "/rank" + std::to_string(rank) + ".json", report);
}

// Element i of rank q's buffer: small integers, exact in every dtype (bfloat16 included).
double Value(int q, std::size_t i) { return static_cast<double>(q + 1 + static_cast<int>(i % 13)); }

// Stores `v` as `dtype` at element `i` of `buf`, and reads it back.
void Put(DType t, void* buf, std::size_t i, double v) {
  switch (t) {
    case DType::kFloat32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      static_cast<double*>(buf)[i] = v;
      break;
    case DType::kInt32:
      static_cast<std::int32_t*>(buf)[i] = static_cast<std::int32_t>(v);
      break;
    case DType::kInt64:
      static_cast<std::int64_t*>(buf)[i] = static_cast<std::int64_t>(v);
      break;
    case DType::kFloat16:
      static_cast<std::uint16_t*>(buf)[i] = crun::worker::FloatToHalf(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      static_cast<std::uint16_t*>(buf)[i] = crun::worker::FloatToBFloat16(static_cast<float>(v));
      break;
  }
}
double Get(DType t, const void* buf, std::size_t i) {
  switch (t) {
    case DType::kFloat32:
      return static_cast<const float*>(buf)[i];
    case DType::kFloat64:
      return static_cast<const double*>(buf)[i];
    case DType::kInt32:
      return static_cast<const std::int32_t*>(buf)[i];
    case DType::kInt64:
      return static_cast<const std::int64_t*>(buf)[i];
    case DType::kFloat16:
      return crun::worker::HalfToFloat(static_cast<const std::uint16_t*>(buf)[i]);
    case DType::kBFloat16:
      return crun::worker::BFloat16ToFloat(static_cast<const std::uint16_t*>(buf)[i]);
  }
  return 0;
}

double Expected(ReduceOp op, int world, std::size_t i) {
  double sum = 0, lo = Value(0, i), hi = Value(0, i);
  for (int q = 0; q < world; ++q) {
    sum += Value(q, i);
    lo = std::min(lo, Value(q, i));
    hi = std::max(hi, Value(q, i));
  }
  switch (op) {
    case ReduceOp::kSum:
      return sum;
    case ReduceOp::kAvg:
      return sum / world;
    case ReduceOp::kMin:
      return lo;
    case ReduceOp::kMax:
      return hi;
  }
  return 0;
}

void Expect(bool good, const std::string& what, std::size_t i, double got, double want) {
  if (!good) {
    throw Failure{what + ": element " + std::to_string(i) + " is " + std::to_string(got) +
                  ", expected " + std::to_string(want)};
  }
}

bool Close(double got, double want) { return std::abs(got - want) <= 1e-3 * std::abs(want); }

struct Sweep {
  ProcessGroup& g;
  int checks = 0;

  void AllReduce(DType t, ReduceOp op, std::size_t n) {
    const std::string what =
        std::string("allreduce ") + Name(t) + " " + Name(op) + " x" + std::to_string(n);
    std::vector<std::uint8_t> buf(n * SizeOf(t));
    for (std::size_t i = 0; i < n; ++i) Put(t, buf.data(), i, Value(g.rank(), i));
    Require(g.AllReduce(buf.data(), n, t, op), what);
    for (std::size_t i = 0; i < n; ++i) {
      const double want = Expected(op, g.size(), i), got = Get(t, buf.data(), i);
      Expect(Close(got, want), what, i, got, want);
    }
    ++checks;
  }

  void ReduceScatter(DType t, ReduceOp op, std::size_t n) {
    const std::string what =
        std::string("reduce-scatter ") + Name(t) + " " + Name(op) + " x" + std::to_string(n);
    const std::size_t total = n * static_cast<std::size_t>(g.size());
    std::vector<std::uint8_t> in(total * SizeOf(t)), out(n * SizeOf(t));
    for (std::size_t i = 0; i < total; ++i) Put(t, in.data(), i, Value(g.rank(), i));
    Require(g.ReduceScatter(in.data(), out.data(), n, t, op), what);
    const std::size_t base = static_cast<std::size_t>(g.rank()) * n;
    for (std::size_t i = 0; i < n; ++i) {
      const double want = Expected(op, g.size(), base + i), got = Get(t, out.data(), i);
      Expect(Close(got, want), what, i, got, want);
    }
    ++checks;
  }

  void Broadcast(DType t, std::size_t n) {
    const int root = g.size() - 1;
    const std::string what = std::string("broadcast ") + Name(t) + " x" + std::to_string(n);
    std::vector<std::uint8_t> buf(n * SizeOf(t));
    for (std::size_t i = 0; i < n; ++i) Put(t, buf.data(), i, Value(g.rank(), i));
    Require(g.Broadcast(buf.data(), n, t, root), what);
    for (std::size_t i = 0; i < n; ++i) {
      const double want = Value(root, i), got = Get(t, buf.data(), i);
      Expect(got == want, what, i, got, want);
    }
    ++checks;
  }

  void AllGather(DType t, std::size_t n) {
    const std::string what = std::string("allgather ") + Name(t) + " x" + std::to_string(n);
    std::vector<std::uint8_t> in(n * SizeOf(t)), out(n * SizeOf(t) * g.size());
    for (std::size_t i = 0; i < n; ++i) Put(t, in.data(), i, Value(g.rank(), i));
    Require(g.AllGather(in.data(), out.data(), n, t), what);
    for (int q = 0; q < g.size(); ++q) {
      for (std::size_t i = 0; i < n; ++i) {
        const double want = Value(q, i), got = Get(t, out.data(), q * n + i);
        Expect(got == want, what, q * n + i, got, want);
      }
    }
    ++checks;
  }
};

int Check(crun::worker::Context& ctx, const std::string& out, std::size_t max_bytes) {
  auto made = crun::worker::MakeGlooGroup(ctx);
  Require(made.status(), "gloo group");
  ProcessGroup& g = **made;
  Sweep s{g};
  const DType all[] = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                       DType::kBFloat16, DType::kInt32,   DType::kInt64};
  for (DType t : all) {
    // One element, 4 KiB, 1 MiB and (float32 only) the largest size asked for.
    std::vector<std::size_t> counts = {1, 4096 / SizeOf(t), (1u << 20) / SizeOf(t)};
    if (t == DType::kFloat32 && max_bytes > (1u << 20)) counts.push_back(max_bytes / 4);
    for (std::size_t n : counts) {
      if (n * SizeOf(t) > max_bytes) continue;
      s.AllReduce(t, ReduceOp::kSum, n);
      s.AllReduce(t, ReduceOp::kMax, n);
      if (t != DType::kInt32 && t != DType::kInt64) s.AllReduce(t, ReduceOp::kAvg, n);
      s.ReduceScatter(t, ReduceOp::kMin, std::max<std::size_t>(1, n / g.size()));
      s.Broadcast(t, n);
      s.AllGather(t, std::max<std::size_t>(1, n / g.size()));
    }
  }
  Require(g.Barrier(), "barrier");

  // Two groups at once: each runs its allreduce on its own thread, concurrently.
  crun::worker::GlooOptions other;
  other.name = "second";
  auto second = crun::worker::MakeGlooGroup(ctx, other);
  Require(second.status(), "second gloo group");
  std::vector<float> a(1 << 18, static_cast<float>(g.rank() + 1)), b(1 << 18, 1.0f);
  auto wa = g.AllReduceAsync(a.data(), a.size(), DType::kFloat32, ReduceOp::kSum, g.timeout());
  auto wb =
      (*second)->AllReduceAsync(b.data(), b.size(), DType::kFloat32, ReduceOp::kMax, g.timeout());
  Require(wa->Wait(), "allreduce on the first group");
  Require(wb->Wait(), "allreduce on the second group");
  const float sum = static_cast<float>(g.size() * (g.size() + 1) / 2);
  Expect(a.front() == sum && a.back() == sum, "first group", 0, a.front(), sum);
  Expect(b.front() == 1.0f && b.back() == 1.0f, "second group", 0, b.front(), 1.0);
  s.checks += 2;

  WriteReport(out, g.rank(),
              {{"rank", g.rank()},
               {"world", g.size()},
               {"checks", s.checks},
               {"shared_memory", crun::worker::GlooUsesSharedMemory(g)},
               {"ok", true}});
  return 0;
}

int Die(crun::worker::Context& ctx, const std::string& out, int victim, bool hang,
        long timeout_ms) {
  crun::worker::GlooOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  auto made = crun::worker::MakeGlooGroup(ctx, o);
  Require(made.status(), "gloo group");
  ProcessGroup& g = **made;
  Require(g.Barrier(), "warm-up barrier");
  std::vector<float> x(16u << 20, 1.0f);  // 64 MiB
  const std::string started = ctx.round_prefix() + "die/started/";
  if (g.rank() == victim) {
    // Wait until every survivor has its allreduce under way, join in, then stop.
    std::vector<std::string> keys;
    for (int q = 0; q < g.size(); ++q) {
      if (q != victim) keys.push_back(started + std::to_string(q));
    }
    Require(ctx.store().Wait(keys, std::chrono::minutes(2)), "wait for survivors");
    auto work = g.AllReduceAsync(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, g.timeout());
    std::fprintf(stderr, "rank %d: %s now, mid-allreduce\n", g.rank(), hang ? "hanging" : "dying");
    raise(hang ? SIGSTOP : SIGKILL);
    return 5;  // not reached while stopped; a continued victim is killed by the test
  }
  const auto t0 = Clock::now();
  auto work = g.AllReduceAsync(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, g.timeout());
  Require(ctx.store().Set(started + std::to_string(g.rank()), "1"), "announce start");
  const crun::Status s = work->Wait();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  WriteReport(out, g.rank(),
              {{"rank", g.rank()},
               {"ok", s.ok()},
               {"shared_memory", crun::worker::GlooUsesSharedMemory(g)},
               {"code", std::string(crun::StatusCodeName(s.code()))},
               {"message", s.message()},
               {"elapsed_ms", ms.count()}});
  return s.ok() ? 3 : 0;
}

// Repetitions for a size: enough to move about 1 GiB, between 3 and 50.
int Repetitions(std::size_t bytes) {
  const std::size_t target = std::size_t{1} << 30;
  return static_cast<int>(std::clamp<std::size_t>(target / std::max<std::size_t>(bytes, 1), 3, 50));
}

int Bench(crun::worker::Context& ctx, const std::string& out, const std::string& sizes) {
  auto made = crun::worker::MakeGlooGroup(ctx);
  Require(made.status(), "gloo group");
  ProcessGroup& g = **made;
  nlohmann::json results = nlohmann::json::array();
  std::size_t start = 0;
  while (start < sizes.size()) {
    const std::size_t comma = std::min(sizes.find(',', start), sizes.size());
    const std::size_t bytes = std::stoull(sizes.substr(start, comma - start));
    start = comma + 1;
    std::vector<float> x(bytes / 4, 1.0f);
    Require(g.AllReduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum), "warm-up");
    std::vector<double> seconds;
    for (int i = 0, n = Repetitions(bytes); i < n; ++i) {
      Require(g.Barrier(), "barrier");
      const auto t0 = Clock::now();
      Require(g.AllReduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum), "allreduce");
      seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    // The slowest rank's time is the collective's: take the max over ranks per repetition.
    Require(g.AllReduce(seconds.data(), seconds.size(), DType::kFloat64, ReduceOp::kMax), "max");
    std::sort(seconds.begin(), seconds.end());
    results.push_back({{"bytes", bytes},
                       {"seconds", seconds[seconds.size() / 2]},
                       {"repetitions", seconds.size()}});
  }
  if (g.rank() == 0) {
    std::ofstream(out + "/bench.json")
        << nlohmann::json{{"world", g.size()},
                          {"shared_memory", crun::worker::GlooUsesSharedMemory(g)},
                          {"results", results}}
               .dump()
        << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto usage = [] {
    std::fprintf(stderr,
                 "usage: gloo_worker check OUT_DIR MAX_BYTES\n"
                 "       gloo_worker die OUT_DIR VICTIM kill|hang TIMEOUT_MS\n");
    return 2;
  };
  if (args.size() < 2) return usage();
  auto ctx = crun::worker::Context::FromEnvironment();
  if (!ctx.ok()) {
    std::fprintf(stderr, "gloo_worker: %s\n", ctx.status().message().c_str());
    return 2;
  }
  try {
    if (args[0] == "check" && args.size() == 3) {
      return Check(**ctx, args[1], std::stoull(args[2]));
    }
    if (args[0] == "bench" && args.size() == 3) return Bench(**ctx, args[1], args[2]);
    if (args[0] == "die" && args.size() == 5) {
      return Die(**ctx, args[1], std::stoi(args[2]), args[3] == "hang", std::stol(args[4]));
    }
  } catch (const Failure& f) {
    std::fprintf(stderr, "gloo_worker rank %d: %s\n", (*ctx)->env().rank, f.what.c_str());
    return 1;
  }
  return usage();
}
