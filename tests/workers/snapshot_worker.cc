// A native SDK worker for the snapshot store's soak (tests/integration/test_snapshots.py).
//
//   snapshot_worker DIR STEPS BYTES KILLS
//     Loads the job's snapshot (collective), checks that every byte of it is what the step and
//     the rank say, and that the step is the newest one every rank committed; then saves steps
//     from there to STEPS, every rank in step with the others (a store barrier per step, as a
//     collective would hold them), each save BYTES in three items. DIR/committed-R is the
//     step rank R holds: written after each save returns and after each load. In attempts 0 ..
//     KILLS-1, one rank (the attempt's number modulo the world) SIGKILLs itself in the middle of a
//     save at a step and byte that a seeded generator picks. Around a save and the record of its
//     commit, SIGTERM waits (crun stops the other ranks with it), so DIR/committed-R is exact.
//     Writes DIR/cgroup-R-A (its cgroup, from /proc/self/cgroup) at its start and
//     DIR/result-R-A.json for attempt A at its end; DIR/started-R, the first step it saves, once
//     it has loaded.
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "crun/worker/context.h"
#include "crun/worker/snapshot.h"

namespace {

using crun::worker::SnapshotItem;

std::uint8_t Pattern(std::uint64_t step, int rank, std::size_t item, std::uint64_t i) {
  return static_cast<std::uint8_t>(
      (step * 131 + static_cast<std::uint64_t>(rank) * 7 + item * 31 + i * 17 + (i >> 11)) & 0xff);
}

[[noreturn]] void Fail(const std::string& dir, int rank, const std::string& why) {
  std::fprintf(stderr, "snapshot_worker rank %d: %s\n", rank, why.c_str());
  // Whole or absent: a worker that crun's death kills while it writes leaves no empty file.
  const std::string path = dir + "/error-" + std::to_string(rank);
  { std::ofstream(path + ".tmp") << why << "\n"; }
  std::rename((path + ".tmp").c_str(), path.c_str());
  std::_Exit(3);
}

long ReadCommitted(const std::string& dir, int rank) {
  std::ifstream in(dir + "/committed-" + std::to_string(rank));
  long v = -1;
  in >> v;
  return v;
}

void WriteCommitted(const std::string& dir, int rank, std::uint64_t step) {
  const std::string path = dir + "/committed-" + std::to_string(rank);
  { std::ofstream(path + ".tmp") << step << "\n"; }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: snapshot_worker DIR STEPS BYTES KILLS\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::uint64_t steps = std::strtoull(argv[2], nullptr, 10);
  const std::uint64_t bytes = std::strtoull(argv[3], nullptr, 10);
  const int kills = std::atoi(argv[4]);
  auto ctx = crun::worker::Context::FromEnvironment();
  if (!ctx.ok()) Fail(dir, -1, ctx.status().ToString());
  const auto& env = (*ctx)->env();
  const int rank = env.rank, world = env.world_size, attempt = env.restart_count;
  {
    std::ifstream in("/proc/self/cgroup");
    std::ofstream(dir + "/cgroup-" + std::to_string(rank) + "-" + std::to_string(attempt))
        << in.rdbuf();
  }
  auto store = crun::worker::SnapshotStore::Connect(env);
  if (!store.ok()) Fail(dir, rank, store.status().ToString());

  // What every rank committed before this attempt: the job resumes at the lowest (ranks are
  // at most one step apart, and each holds its newest two).
  long expected = -1;
  for (int r = 0; r < world; ++r) {
    const long c = ReadCommitted(dir, r);
    if (r == 0 || c < expected) expected = c;
  }
  auto loaded = (*store)->Load(**ctx);
  if (!loaded.ok()) Fail(dir, rank, "load: " + loaded.status().ToString());
  std::uint64_t start = 1;
  if (loaded->has_value()) {
    const auto& s = **loaded;
    if (static_cast<long>(s.step) != expected) {
      Fail(dir, rank,
           "loaded step " + std::to_string(s.step) + ", expected " + std::to_string(expected));
    }
    for (std::size_t k = 0; k < 3; ++k) {
      const auto* item = s.Find("item" + std::to_string(k));
      if (item == nullptr) Fail(dir, rank, "item" + std::to_string(k) + " missing");
      const unsigned char* data = s.data[static_cast<std::size_t>(item - s.items.data())];
      for (std::uint64_t i = 0; i < item->bytes; ++i) {
        if (data[i] != Pattern(s.step, rank, k, i)) {
          Fail(dir, rank,
               "item" + std::to_string(k) + " byte " + std::to_string(i) + " of step " +
                   std::to_string(s.step) + " is wrong");
        }
      }
    }
    start = s.step + 1;
    // What this rank holds now: a newer step it had saved is dropped by the load (another
    // rank does not have it).
    WriteCommitted(dir, rank, s.step);
  } else if (expected != -1) {
    Fail(dir, rank, "nothing loaded, expected step " + std::to_string(expected));
  }

  std::ofstream(dir + "/started-" + std::to_string(rank)) << start << "\n";
  std::mt19937_64 rng(static_cast<std::uint64_t>(attempt) * 1000003ULL + 17);
  const bool killer = attempt < kills && attempt % world == rank;
  const std::uint64_t kill_step = start + rng() % 5;
  const std::uint64_t kill_byte = rng() % bytes;
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  for (std::uint64_t step = start; step <= steps; ++step) {
    const auto barrier =
        (*ctx)->store().Barrier((*ctx)->round_prefix() + "step/" + std::to_string(step), world,
                                std::chrono::seconds(60));
    if (!barrier.ok()) Fail(dir, rank, "barrier: " + barrier.ToString());
    std::vector<SnapshotItem> items;
    const std::uint64_t sizes[3] = {bytes / 2, bytes / 3, bytes - bytes / 2 - bytes / 3};
    std::uint64_t offset = 0;
    for (std::size_t k = 0; k < 3; ++k) {
      SnapshotItem item;
      item.name = "item" + std::to_string(k);
      item.dtype = "uint8";
      item.shape = {static_cast<std::int64_t>(sizes[k])};
      item.bytes = sizes[k];
      item.fill = [=](unsigned char* dst) {
        for (std::uint64_t i = 0; i < sizes[k]; ++i) {
          if (killer && step == kill_step && offset + i == kill_byte) ::raise(SIGKILL);
          dst[i] = Pattern(step, rank, k, i);
        }
      };
      offset += sizes[k];
      items.push_back(std::move(item));
    }
    sigprocmask(SIG_BLOCK, &term, nullptr);
    const auto saved = (*store)->Save(step, items);
    if (!saved.ok()) Fail(dir, rank, "save: " + saved.ToString());
    WriteCommitted(dir, rank, step);
    sigprocmask(SIG_UNBLOCK, &term, nullptr);
  }
  std::ofstream(dir + "/result-" + std::to_string(rank) + "-" + std::to_string(attempt) + ".json")
      << nlohmann::json{{"rank", rank},
                        {"attempt", attempt},
                        {"start", start},
                        {"expected", expected}}
             .dump()
      << "\n";
  return 0;
}
