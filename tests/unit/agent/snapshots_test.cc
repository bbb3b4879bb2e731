// The node's snapshot store: the layout's table, the step every rank agrees on, crun's memory
// (sizing, sealing, checking, the room check), and the SDK saving and loading through a real
// server in this process.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "agent/snapshots/disk_snapshots.h"
#include "agent/snapshots/node_snapshots.h"
#include "agent/snapshots/peer_link.h"
#include "agent/snapshots/replicas.h"
#include "agent/snapshots/snapshot_server.h"
#include "base/socket.h"
#include "crun/worker/snapshot.h"
#include "rendezvous/store/memory_store.h"
#include "rendezvous/store_server/round_store.h"
#include "tests/unit/temp_dir.h"

namespace crun::agent {
namespace {

namespace snap = crun::snapshot;
using worker::SnapshotItem;

TEST_CASE("the table of contents round-trips and refuses an item past the payload") {
  std::vector<snap::Item> items = {{"param/w", "float32", {3, 4}, 0, 48},
                                   {"v", "bytes", {5}, 0, 5},
                                   {"empty", "int64", {0}, 0, 0}};
  const auto payload = snap::PlaceItems(items);
  for (const auto& i : items) CHECK(i.offset % snap::kAlign == 0);
  CHECK(items[0].offset >= snap::TocBytes(items));
  const std::string toc = snap::EncodeToc(items);
  CHECK(toc.size() == snap::TocBytes(items));
  const auto back = snap::DecodeToc(toc, payload);
  REQUIRE(back);
  REQUIRE(back->size() == 3);
  CHECK((*back)[0].name == "param/w");
  CHECK((*back)[0].shape == std::vector<std::int64_t>{3, 4});
  CHECK((*back)[1].offset == items[1].offset);
  CHECK_FALSE(snap::DecodeToc(toc, items[1].offset + 2));  // item 1 would run past the end
  CHECK_FALSE(snap::DecodeToc(toc.substr(0, toc.size() - 3), payload));
}

TEST_CASE("the job resumes at the newest step that every rank holds") {
  using Held = std::vector<std::vector<std::uint64_t>>;
  CHECK(worker::AgreeStep(Held{{3, 2}, {3, 2}}) == 3u);
  CHECK(worker::AgreeStep(Held{{3, 2}, {2, 1}}) == 2u);  // rank 1 died mid-save of 3
  CHECK(worker::AgreeStep(Held{{5, 4}, {4, 3}, {5, 4}}) == 4u);
  CHECK(worker::AgreeStep(Held{{2}, {3, 2}}) == 2u);
  CHECK_FALSE(worker::AgreeStep(Held{{3, 2}, {}}));  // a rank with nothing: none
  CHECK_FALSE(worker::AgreeStep(Held{{7, 6}, {4, 3}}));
  CHECK_FALSE(worker::AgreeStep(Held{}));
}

// Writes a complete snapshot of `bytes` payload bytes of value `fill` into `b` as a worker
// would.
void WriteComplete(SnapshotBuffer& b, std::uint64_t step, std::uint64_t generation,
                   std::uint64_t bytes, unsigned char fill) {
  snap::BufferHeader& h = b.header();
  snap::StoreState(h, snap::kWriting);
  std::memset(const_cast<unsigned char*>(b.payload()), fill, bytes);
  h.step = step;
  h.payload_bytes = bytes;
  h.rank = 0;
  h.world_size = 1;
  h.layout = snap::kSharded;
  h.generation = generation;
  snap::StoreState(h, snap::kComplete);
}

TEST_CASE("crun's memory: sized on demand, sealed, and a changed byte fails the check") {
  testing::TempDir tmp("crun_snap");
  NodeSnapshots memory({"/dev/shm", ""});
  auto a = memory.Reserve(0, 0, 1000);
  REQUIRE(a.ok());
  CHECK((*a)->capacity() >= 1000);
  CHECK(memory.allocated_bytes() == snap::kHeaderBytes + (*a)->capacity());
  CHECK(memory.Check(0)[0].verdict == BufferVerdict::kIncomplete);
  WriteComplete(**a, 7, 1, 1000, 0x5a);
  memory.Seal(0, 0);
  auto checks = memory.Check(0);
  CHECK(checks[0].verdict == BufferVerdict::kValid);
  CHECK(checks[0].step == 7);
  CHECK(checks[1].verdict == BufferVerdict::kNone);
  // The newest complete buffer is never replaced: a save writes the other one.
  auto refused = memory.Reserve(0, 0, 5000);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("holds its newest complete snapshot"));
  auto b = memory.Reserve(0, 1, 5000);
  REQUIRE(b.ok());
  WriteComplete(**b, 8, 2, 5000, 0x11);
  // A load checks the newest (step 8) and leaves the older one sealed until it is wanted.
  const_cast<unsigned char*>((*a)->payload())[10] ^= 1;
  checks = memory.Check(0);
  CHECK(checks[0].verdict == BufferVerdict::kSealed);
  CHECK(checks[1].verdict == BufferVerdict::kValid);
  CHECK(memory.Verify(0, 0).verdict == BufferVerdict::kCorrupt);
  const_cast<unsigned char*>((*a)->payload())[10] ^= 1;
  CHECK(memory.Verify(0, 0).verdict == BufferVerdict::kValid);
  // Now buffer 0 is the older one, and may grow.
  auto grown = memory.Reserve(0, 0, 9000);
  REQUIRE(grown.ok());
  CHECK((*grown)->capacity() >= 9000);
  // A byte changed behind crun's back: corrupt, with its step.
  memory.Seal(0, 1);
  const_cast<unsigned char*>((*b)->payload())[4321] ^= 1;
  checks = memory.Check(0);
  CHECK(checks[1].verdict == BufferVerdict::kCorrupt);
  CHECK(checks[1].step == 8);
  // So is a changed step (the checksum covers what the header says of the payload).
  const_cast<unsigned char*>((*b)->payload())[4321] ^= 1;
  CHECK(memory.Check(0)[1].verdict == BufferVerdict::kValid);
  (*b)->header().step = 9;
  CHECK(memory.Check(0)[1].verdict == BufferVerdict::kCorrupt);
  memory.Clear();
  CHECK(memory.allocated_bytes() == 0);
}

TEST_CASE("disk: the steps written are those every rank would choose alike") {
  // The first save of a crun, then the first at or past each multiple of `every`.
  std::vector<std::uint64_t> chosen;
  std::optional<std::uint64_t> last;
  for (std::uint64_t step = 3; step <= 60; step += 7) {
    if (ChoosesStep(step, 10, last ? &*last : nullptr)) {
      chosen.push_back(step);
      last = step;
    }
  }
  CHECK(chosen == std::vector<std::uint64_t>{3, 10, 24, 31, 45, 52});
  const std::uint64_t at = 40;
  CHECK_FALSE(ChoosesStep(40, 10, &at));  // the same step again
  CHECK_FALSE(ChoosesStep(12, 10, &at));  // an older one (a resumed timeline)
  CHECK(ChoosesStep(41, 1, &at));
  CHECK(SnapshotFilePath("/ck", 42, 3) == "/ck/step-000000000042/rank-00003.snap");
}

TEST_CASE("disk: a staged copy is whole or refused, and a file restores into memory") {
  testing::TempDir tmp("crun_disk");
  NodeSnapshots memory({"/dev/shm", ""});
  auto a = memory.Reserve(0, 0, 4096);
  REQUIRE(a.ok());
  WriteComplete(**a, 12, 1, 4096, 0x42);
  (*a)->header().rank = 1;
  std::vector<unsigned char> staged;
  // A save that began while the copy was taken: the copy is not whole, nothing is sealed.
  snap::StoreState((*a)->header(), snap::kWriting);
  CHECK(memory.Stage(0, 0, &staged).verdict == BufferVerdict::kIncomplete);
  snap::StoreState((*a)->header(), snap::kComplete);
  const BufferCheck staged_check = memory.Stage(0, 0, &staged);
  REQUIRE(staged_check.verdict == BufferVerdict::kValid);
  CHECK(staged_check.step == 12);
  CHECK(memory.Check(0)[0].verdict == BufferVerdict::kValid);  // sealed by the copy

  SnapshotDiskOptions o;
  o.dir = tmp.path + "/ck";
  o.keep = 2;
  DiskSnapshots disk(o);
  REQUIRE(disk.Prepare().ok());
  REQUIRE(disk.Write(staged).ok());
  CHECK(disk.Steps(0, 1).empty());  // another rank's file
  CHECK(disk.Steps(1, 1) == std::vector<std::uint64_t>{12});
  CHECK(disk.Steps(1, 4).empty());  // sharded, another world size
  // Two more steps: the oldest goes, with its directory.
  for (std::uint64_t step : {13, 14}) {
    auto* h = reinterpret_cast<snap::BufferHeader*>(staged.data());
    h->step = step;
    REQUIRE(disk.Write(staged).ok());
  }
  CHECK(disk.Steps(1, 1) == std::vector<std::uint64_t>{14, 13});
  CHECK_FALSE(std::filesystem::exists(o.dir + "/step-000000000012"));

  // Into a fresh node's memory: step 12 was whole; 14 has the step changed behind the checksum.
  o.keep = 3;
  DiskSnapshots reread(o);
  {
    auto* h = reinterpret_cast<snap::BufferHeader*>(staged.data());
    h->step = 12;
    REQUIRE(reread.Write(staged).ok());
  }
  NodeSnapshots fresh({"/dev/shm", ""});
  auto index = reread.Restore(fresh, 0, 1, 12);
  REQUIRE(index.ok());
  const auto check = fresh.Check(0)[static_cast<std::size_t>(*index)];
  CHECK(check.verdict == BufferVerdict::kValid);
  CHECK(check.step == 12);
  CHECK(fresh.Slot(0)[static_cast<std::size_t>(*index)]->payload()[100] == 0x42);
  auto corrupt = reread.Restore(fresh, 0, 1, 14);
  REQUIRE_FALSE(corrupt.ok());
  CHECK_THAT(corrupt.status().message(),
             Catch::Contains("the snapshot of rank 1 at step 14 fails its checksum"));
  CHECK_FALSE(reread.Restore(fresh, 0, 1, 99).ok());  // no such file
}

TEST_CASE("disk: a rank's steps go by the job's step, not by its own alone") {
  using Steps = std::vector<std::uint64_t>;
  // Job's step known: the newest `keep` at or below it stay, and what is above it.
  CHECK(StepsToDrop({9, 8, 7, 6, 5}, 7, 2) == Steps{5});
  CHECK(StepsToDrop({9, 8, 7, 6, 5}, 9, 2) == Steps{7, 6, 5});
  CHECK(StepsToDrop({9, 8}, 3, 1).empty());  // nothing at or below it: all are ahead
  // Not known: up to keep + kStepsAhead stay.
  CHECK(StepsToDrop({9, 8, 7, 6, 5, 4, 3}, std::nullopt, 2) == Steps{3});
  CHECK(StepsToDrop({12, 11, 10, 9, 8, 7, 6, 5}, 5, 1) == Steps{7, 6});  // 1 + 4 ahead
  CHECK(StepsToDrop({4}, 4, 0).empty());                                 // one is always kept
}

// Writes rank `rank`'s step `step` of a world of 2 through `disk`, from a staged copy of any
// snapshot.
void WriteStep(DiskSnapshots& disk, std::vector<unsigned char> staged, std::int64_t rank,
               std::uint64_t step) {
  auto* h = reinterpret_cast<snap::BufferHeader*>(staged.data());
  h->rank = rank;
  h->world_size = 2;
  h->step = step;
  REQUIRE(disk.Write(staged).ok());
}

TEST_CASE("disk: nodes with directories of their own keep a step that every rank holds") {
  testing::TempDir tmp("crun_disk_job");
  NodeSnapshots memory({"/dev/shm", ""});
  auto a = memory.Reserve(0, 0, 4096);
  REQUIRE(a.ok());
  WriteComplete(**a, 1, 1, 4096, 0x42);
  std::vector<unsigned char> staged;
  REQUIRE(memory.Stage(0, 0, &staged).verdict == BufferVerdict::kValid);
  RoundStoreHost round;
  RoundStoreSpec spec;
  spec.bind_host = "127.0.0.1";
  spec.world_size = 2;
  auto port = round.Serve(1, spec);
  REQUIRE(port.ok());
  // Two nodes, one rank each, keep 1, each writing to a directory of its own.
  const auto node = [&](int g) {
    SnapshotDiskOptions o;
    o.dir = tmp.path + "/node" + std::to_string(g);
    o.keep = 1;
    auto d = std::make_unique<DiskSnapshots>(o);
    REQUIRE(d->Prepare().ok());
    d->NewRound({g, 2, g, 1, "127.0.0.1", *port});
    return d;
  };
  auto fast = node(0), slow = node(1);
  // The fast node is ahead and the slow one has written nothing: nothing the job holds yet,
  // so the fast node keeps its steps (up to 1 + kStepsAhead).
  for (std::uint64_t step : {1, 2, 3}) WriteStep(*fast, staged, 0, step);
  CHECK(fast->Steps(0, 2) == std::vector<std::uint64_t>{3, 2, 1});
  // The slow node has step 1: the job's step is 1, and the fast node keeps it.
  WriteStep(*slow, staged, 1, 1);
  CHECK(slow->JobStep(1) == 1u);
  WriteStep(*fast, staged, 0, 4);
  CHECK(fast->Steps(0, 2) == std::vector<std::uint64_t>{4, 3, 2, 1});
  // Before: each rank kept its own newest step alone, 4 and 1, and no step was held by both.
  // The slow node catches up: the job holds 4, and the older steps go on both nodes.
  for (std::uint64_t step : {2, 3, 4}) WriteStep(*slow, staged, 1, step);
  CHECK(slow->Steps(1, 2) == std::vector<std::uint64_t>{4});
  WriteStep(*fast, staged, 0, 5);
  CHECK(fast->Steps(0, 2) == std::vector<std::uint64_t>{5, 4});
  // Between attempts, with no store to ask, the job's step last seen stands.
  fast->NewRound({0, 2, 0, 1, "", 0});
  WriteStep(*fast, staged, 0, 6);
  CHECK(fast->JobStep(0) == 4u);
  CHECK(fast->Steps(0, 2) == std::vector<std::uint64_t>{6, 5, 4});
  round.Stop();
}

TEST_CASE("a checkpoint directory is claimed by one job at a time") {
  testing::TempDir tmp("crun_snap_claim");
  auto options = [&](const std::string& job) {
    SnapshotDiskOptions o;
    o.dir = tmp.path + "/ck";
    o.job = job;
    return o;
  };
  const std::string pid = "pid " + std::to_string(::getpid()) + " on host ";
  {
    DiskSnapshots alone(options(""));
    REQUIRE(alone.Prepare().ok());
    DiskSnapshots second(options(""));
    const Status s = second.Prepare();
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("--checkpoint-dir " + tmp.path +
                                            "/ck is in use by "
                                            "another job: crun " +
                                            pid));
    CHECK_THAT(s.message(), Catch::Contains("(a job of its own)"));
    DiskSnapshots node(options("10.0.0.1:29400 job7"));
    CHECK_FALSE(node.Prepare().ok());
  }
  // Gone with its crun: the nodes of one job share the directory; another job does not.
  DiskSnapshots node0(options("10.0.0.1:29400 job7"));
  REQUIRE(node0.Prepare().ok());
  DiskSnapshots node1(options("10.0.0.1:29400 job7"));
  REQUIRE(node1.Prepare().ok());
  DiskSnapshots other(options("10.0.0.2:29400 job7"));
  const Status s = other.Prepare();
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("(job 10.0.0.1:29400 job7)"));
  // A claim that nobody holds (its crun was SIGKILLed) is removed, not obeyed.
  const std::string stale = tmp.path + "/ck/.crun-claim-elsewhere-1-0";
  { std::ofstream(stale) << "pid 1 on host elsewhere\n"; }
  DiskSnapshots node2(options("10.0.0.1:29400 job7"));
  REQUIRE(node2.Prepare().ok());
  CHECK_FALSE(std::filesystem::exists(stale));
  // A draft is a claim still being written, perhaps not locked yet: another crun neither takes
  // its lock (its writer would then fail to) nor removes it while its writer lives; one whose
  // crun on this host is gone is removed.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string draft =
      tmp.path + "/ck/.crun-claim-draft-" + host + "-" + std::to_string(::getpid()) + "-99";
  { std::ofstream(draft) << ""; }
  pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  REQUIRE(gone > 0);
  REQUIRE(::waitpid(gone, nullptr, 0) == gone);
  const std::string dead =
      tmp.path + "/ck/.crun-claim-draft-" + host + "-" + std::to_string(gone) + "-0";
  const std::string elsewhere =
      tmp.path + "/ck/.crun-claim-draft-elsewhere-" + std::to_string(gone) + "-0";
  { std::ofstream(dead) << ""; }
  { std::ofstream(elsewhere) << ""; }
  DiskSnapshots node3(options("10.0.0.1:29400 job7"));
  REQUIRE(node3.Prepare().ok());
  CHECK(std::filesystem::exists(draft));
  const int fd = ::open(draft.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  CHECK(::flock(fd, LOCK_EX | LOCK_NB) == 0);  // still free for its writer
  ::close(fd);
  CHECK_FALSE(std::filesystem::exists(dead));
  CHECK(std::filesystem::exists(elsewhere));  // another host's pid proves nothing here
}

TEST_CASE("the room check names the size and the limit") {
  testing::TempDir tmp("crun_snap_room");
  // The file system's free space.
  auto s = CheckRoom("local rank 0's snapshot buffer", 1ull << 62, tmp.path, tmp.path);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(s.message(), Catch::StartsWith("local rank 0's snapshot buffer needs "));
  CHECK_THAT(s.message(), Catch::Contains("but " + tmp.path + " has"));
  // A cgroup's memory.max (as its files say).
  const std::string cg = tmp.path + "/cg";
  std::filesystem::create_directories(cg);
  std::ofstream(cg + "/memory.max") << (64 << 20) << "\n";
  std::ofstream(cg + "/memory.current") << (60 << 20) << "\n";
  s = CheckRoom("local rank 1's snapshot buffer", 8 << 20, "/dev/shm", cg);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message() == "local rank 1's snapshot buffer needs 8.0 MiB, but the cgroup " + cg +
                           " (crun's, which is charged) holds 60.0 MiB of its memory.max 64.0 "
                           "MiB: raise the limit or save less");
  std::ofstream(cg + "/memory.max") << "max\n";
  CHECK(CheckRoom("x", 8 << 20, "/dev/shm", cg).ok());
  CHECK_FALSE(CheckRoom("x", 1, tmp.path + "/missing", cg).ok());
}

// A server on a loop of its own, and the SDK's client for `env` in this process.
struct Served {
  boost::asio::io_context io;
  NodeSnapshots memory{{"/dev/shm", ""}};
  std::unique_ptr<SnapshotServer> server;
  std::thread loop;
  explicit Served(DiskSnapshots* disk = nullptr) {
    auto s = SnapshotServer::Listen(io, memory, disk);
    REQUIRE(s.ok());
    server = std::move(*s);
    ::setenv("CRUN_SNAPSHOT_SOCKET", SnapshotSocketName(::getpid()).c_str(), 1);
    loop = std::thread([this] {
      auto guard = boost::asio::make_work_guard(io);
      io.run();
    });
  }
  ~Served() {
    boost::asio::post(io, [this] {
      server.reset();
      io.stop();
    });
    loop.join();
    ::unsetenv("CRUN_SNAPSHOT_SOCKET");
  }
};

worker::WorkerEnv Env(int rank, int world, int local_rank) {
  worker::WorkerEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = local_rank;
  e.run_id = "test";
  return e;
}

std::vector<SnapshotItem> Items(std::uint64_t step, std::uint64_t n) {
  SnapshotItem item;
  item.name = "w";
  item.dtype = "uint8";
  item.shape = {static_cast<std::int64_t>(n)};
  item.bytes = n;
  item.fill = [step, n](unsigned char* dst) { std::memset(dst, static_cast<int>(step), n); };
  return {item};
}

TEST_CASE("the SDK saves, loads the newest, and refuses what is not its own") {
  Served served;
  auto store = std::make_shared<MemoryStore>();
  {
    worker::Context ctx(Env(0, 1, 0), store);
    auto client = worker::SnapshotStore::Connect(ctx.env());
    REQUIRE(client.ok());
    auto none = (*client)->Load(ctx);
    REQUIRE(none.ok());
    CHECK_FALSE(none->has_value());  // nothing saved: none, not an error
    for (std::uint64_t step = 1; step <= 3; ++step) {
      REQUIRE((*client)->Save(step, Items(step, 100 + step * 1000)).ok());
    }
    auto got = (*client)->Load(ctx);
    REQUIRE(got.ok());
    REQUIRE(got->has_value());
    CHECK((*got)->step == 3);
    REQUIRE((*got)->Find("w") != nullptr);
    CHECK((*got)->Find("w")->bytes == 3100);
    CHECK((*got)->DataOf("w")[3099] == 3);
  }
  SECTION("a sharded snapshot of another rank or world size is refused") {
    worker::Context saver(Env(1, 2, 2), store);
    auto a = worker::SnapshotStore::Connect(saver.env());
    REQUIRE(a.ok());
    REQUIRE((*a)->Save(5, Items(5, 64)).ok());
    worker::Context loader(Env(0, 1, 2), store);
    auto b = worker::SnapshotStore::Connect(loader.env());
    REQUIRE(b.ok());
    auto got = (*b)->Load(loader);
    REQUIRE_FALSE(got.ok());
    CHECK_THAT(got.status().message(),
               Catch::Contains("at step 5 was saved by rank 1 of 2, not by rank 0 of 1"));
    // Replicated state loads anywhere.
    REQUIRE((*a)->Save(6, Items(6, 64), snap::kReplicated).ok());
    got = (*b)->Load(loader);
    REQUIRE(got.ok());
    REQUIRE(got->has_value());
    CHECK((*got)->step == 6);
  }
  SECTION("a snapshot whose bytes changed is refused, naming the rank and step") {
    worker::Context ctx(Env(4, 1, 3), store);
    auto c = worker::SnapshotStore::Connect(ctx.env());
    REQUIRE(c.ok());
    REQUIRE((*c)->Save(11, Items(11, 4096)).ok());
    served.memory.Seal(3, 0);  // crun seals after the save; the bytes change afterwards
    auto slot = served.memory.Slot(3);
    REQUIRE(slot[0]);
    const_cast<unsigned char*>(slot[0]->payload())[2000] ^= 0xff;
    auto got = (*c)->Load(ctx);
    REQUIRE_FALSE(got.ok());
    CHECK_THAT(got.status().message(),
               Catch::Contains("the snapshot of rank 4 at step 11 fails its checksum"));
  }
}

TEST_CASE("a load drops a newer step that another rank does not hold") {
  // Rank 1 saved step 3; rank 0 died before it did. The job resumes at 2, and rank 1's step 3
  // belongs to an abandoned timeline: left complete, the next save would overwrite step 2 (the
  // older generation) and a kill in that save would leave the ranks with no common step.
  Served served;
  auto store = std::make_shared<MemoryStore>();
  worker::Context c0(Env(0, 2, 0), store), c1(Env(1, 2, 1), store);
  auto s0 = worker::SnapshotStore::Connect(c0.env());
  auto s1 = worker::SnapshotStore::Connect(c1.env());
  REQUIRE(s0.ok());
  REQUIRE(s1.ok());
  for (std::uint64_t step = 1; step <= 2; ++step) REQUIRE((*s0)->Save(step, Items(step, 64)).ok());
  for (std::uint64_t step = 1; step <= 3; ++step) REQUIRE((*s1)->Save(step, Items(step, 64)).ok());
  StatusOr<std::optional<worker::LoadedSnapshot>> got1 = Status::Ok();
  std::thread other([&] { got1 = (*s1)->Load(c1, std::chrono::seconds(30)); });
  auto got0 = (*s0)->Load(c0, std::chrono::seconds(30));
  other.join();
  REQUIRE(got0.ok());
  REQUIRE(got1.ok());
  REQUIRE(got0->has_value());
  REQUIRE(got1->has_value());
  CHECK((*got0)->step == 2);
  CHECK((*got1)->step == 2);
  CHECK((*got1)->DataOf("w")[0] == 2);
  // Only step 2 is left complete in rank 1's slot, so its next save writes the other buffer.
  const auto checks = served.memory.Check(1);
  int valid = 0;
  for (const auto& c : checks) {
    if (c.verdict == BufferVerdict::kValid) {
      ++valid;
      CHECK(c.step == 2);
    }
  }
  CHECK(valid == 1);
  REQUIRE((*s1)->Save(3, Items(3, 64)).ok());
  const auto after = served.memory.Check(1);
  CHECK(((after[0].step == 2 && after[1].step == 3) || (after[0].step == 3 && after[1].step == 2)));
}

TEST_CASE("a save bigger than the memory's room is refused before anything is written") {
  Served served;
  auto store = std::make_shared<MemoryStore>();
  worker::Context ctx(Env(0, 1, 0), store);
  auto client = worker::SnapshotStore::Connect(ctx.env());
  REQUIRE(client.ok());
  SnapshotItem huge;
  huge.name = "huge";
  huge.dtype = "uint8";
  huge.bytes = 1ull << 50;
  huge.fill = [](unsigned char*) { FAIL("a refused save wrote"); };
  auto s = (*client)->Save(1, {huge});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::StartsWith("local rank 0's snapshot buffer needs 1024.00 TiB, "
                                            "but /dev/shm has "));
  CHECK(served.memory.allocated_bytes() == 0);
}

TEST_CASE("a save waits until crun has sealed and copied what it overwrites") {
  // Every step chosen for disk (--checkpoint-every 1) and saves as fast as the worker can:
  // without the wait, the writer falls behind and the worker overwrites buffers that crun has
  // not copied yet, so some steps never reach the disk (and the job's ranks differ in which).
  testing::TempDir tmp("crun_snap_settle");
  SnapshotDiskOptions o;
  o.dir = tmp.path + "/ck";
  o.every = 1;
  o.keep = 1000;
  DiskSnapshots disk(o);
  REQUIRE(disk.Prepare().ok());
  constexpr std::uint64_t kSteps = 100;
  {
    Served served(&disk);
    auto store = std::make_shared<MemoryStore>();
    worker::Context ctx(Env(0, 1, 0), store);
    auto client = worker::SnapshotStore::Connect(ctx.env());
    REQUIRE(client.ok());
    for (std::uint64_t step = 1; step <= kSteps; ++step) {
      REQUIRE((*client)->Save(step, Items(step, 256 << 10)).ok());
    }
    // A request that is answered after the last "saved" was read (a save does not wait for
    // crun to read it): only then does the server know of every step.
    REQUIRE((*client)->Load(ctx).ok());
  }  // the server goes; its writer finishes what it was given
  const DiskCounters c = disk.counters();
  INFO("written " << c.written << ", skipped " << c.skipped << ", failed " << c.failed);
  CHECK(c.skipped == 0);
  CHECK(disk.Steps(0, 1).size() == kSteps);
}

// A sealed snapshot of `rank` at `step`, as crun sends it to a peer: header, then payload.
std::vector<unsigned char> SealedCopy(std::int64_t rank, std::uint64_t step, std::size_t n) {
  std::vector<unsigned char> bytes(snap::kHeaderBytes + n);
  for (std::size_t i = 0; i < n; ++i) {
    bytes[snap::kHeaderBytes + i] = static_cast<unsigned char>(step * 7 + i);
  }
  snap::BufferHeader h{};
  std::memcpy(h.magic, snap::kMagic, sizeof h.magic);
  h.version = snap::kVersion;
  h.state = snap::kComplete;
  h.generation = step;
  h.step = step;
  h.payload_bytes = n;
  h.rank = rank;
  h.world_size = 4;
  h.layout = snap::kSharded;
  h.checksum = SnapshotChecksum(h, bytes.data() + snap::kHeaderBytes, n);
  h.checksum_generation = h.generation;
  std::memcpy(bytes.data(), &h, sizeof h);
  return bytes;
}

// A raw peer of a replica server: says its proof (or proves `token`, bound to its TLS session
// when `bind`), then speaks the protocol; over TLS with `tls`.
struct RawPeer {
  PeerLink link;
  explicit RawPeer(std::uint16_t port, const std::string& proof = "-",
                   const std::shared_ptr<PeerTls>& tls = nullptr, const std::string& token = "",
                   bool bind = true) {
    auto c = ConnectTcp("127.0.0.1", port, DeadlineAfter(std::chrono::seconds(5)));
    REQUIRE(c.ok());
    link = PeerLink(std::move(*c));
    REQUIRE(link.Handshake(tls, false, DeadlineAfter(std::chrono::seconds(5)), "peer").ok());
    const std::string hello = Line();
    CHECK(hello.rfind("crun-replica 1 ", 0) == 0);
    const std::string nonce = hello.substr(std::min<std::size_t>(15, hello.size()));
    Send("auth " +
         (token.empty() ? proof : ReplicaProof(token, nonce + (bind ? link.Binding() : ""))) +
         "\n");
  }
  void Send(std::string_view data) {
    REQUIRE(link.Send(data, DeadlineAfter(std::chrono::seconds(5)), "peer").ok());
  }
  std::string Line() {
    std::string line;
    for (char c = 0;;) {
      auto n = link.Recv(&c, 1, 1, DeadlineAfter(std::chrono::seconds(5)), "peer");
      if (!n.ok() || c == '\n') return line;
      line += c;
    }
  }
  std::string Put(const std::vector<unsigned char>& copy) {
    Send("put " + std::to_string(copy.size()) + "\n");
    Send(std::string_view(reinterpret_cast<const char*>(copy.data()), copy.size()));
    return Line();
  }
};

TEST_CASE("a peer keeps the two newest whole copies of a rank, and refuses strangers") {
  auto replicas = Replicas::Listen("");
  REQUIRE(replicas.ok());
  const std::uint16_t port = (*replicas)->port();
  {
    RawPeer peer(port);
    CHECK(peer.Line() == "ok");
    CHECK(peer.Put(SealedCopy(3, 5, 100000)) == "ok");
    CHECK(peer.Put(SealedCopy(3, 6, 100000)) == "ok");
    peer.Send("steps 3 4\n");
    CHECK(peer.Line() == "ok 6,5");
    peer.Send("steps 3 8\n");  // sharded: another world size may not load them
    CHECK(peer.Line() == "ok");
    // A changed byte: dropped, and said.
    auto bad = SealedCopy(3, 7, 100000);
    bad[snap::kHeaderBytes + 500] ^= 0xff;
    CHECK_THAT(peer.Put(bad), Catch::Contains("the copy of rank 3 at step 7 fails its checksum"));
  }
  {
    // The sender SIGKILLed in the middle of a copy: half of it, then the connection ends.
    RawPeer dying(port);
    CHECK(dying.Line() == "ok");
    const auto copy = SealedCopy(3, 8, 100000);
    dying.Send("put " + std::to_string(copy.size()) + "\n");
    dying.Send(std::string_view(reinterpret_cast<const char*>(copy.data()), copy.size() / 2));
  }
  RawPeer reader(port);
  CHECK(reader.Line() == "ok");
  reader.Send("steps 3 4\n");
  CHECK(reader.Line() == "ok 6,5");  // the previous copies, whole
  reader.Send("get 3 6\n");
  const auto want = SealedCopy(3, 6, 100000);
  CHECK(reader.Line() == "ok " + std::to_string(want.size()));
  std::vector<char> got(want.size());
  auto n = reader.link.Recv(got.data(), got.size(), got.size(),
                            DeadlineAfter(std::chrono::seconds(5)), "peer");
  REQUIRE(n.ok());
  CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
  CHECK(reader.Put(SealedCopy(3, 9, 1000)) == "ok");
  reader.Send("steps 3 4\n");
  CHECK(reader.Line() == "ok 9,6");  // two kept
  CHECK((*replicas)->counters().received == 3);

  // Garbage on the port: a copy larger than the machine, or not a snapshot, is refused before
  // anything is allocated for it, and the connection ends (its stream is lost); crun goes on.
  {
    RawPeer liar(port);
    CHECK(liar.Line() == "ok");
    auto huge = SealedCopy(3, 10, 16);
    reinterpret_cast<snap::BufferHeader*>(huge.data())->payload_bytes = (1ULL << 40) - 4096;
    liar.Send("put " + std::to_string(1ULL << 40) + "\n");
    liar.Send(std::string_view(reinterpret_cast<const char*>(huge.data()), snap::kHeaderBytes));
    CHECK_THAT(liar.Line(), Catch::Contains("error a copy of rank 3's snapshot needs 1.00 TiB"));
    CHECK(liar.Line().empty());  // closed
    RawPeer noise(port);
    CHECK(noise.Line() == "ok");
    noise.Send("put 8192\n" + std::string(snap::kHeaderBytes, 'x'));
    CHECK_THAT(noise.Line(), Catch::Contains("error a copy that is not a crun snapshot"));
    noise.Send("steps 3 4\n");
    CHECK(noise.Line().empty());  // closed
  }
  reader.Send("steps 3 4\n");
  CHECK(reader.Line() == "ok 9,6");  // nothing changed, the server still serves

  // With a token, a peer that cannot prove it is refused, and counted.
  auto guarded = Replicas::Listen("job-secret");
  REQUIRE(guarded.ok());
  RawPeer stranger((*guarded)->port(), "0123abcd");
  CHECK(stranger.Line() == "error refused: not this job's token");
  CHECK((*guarded)->counters().refused == 1);
}

// A sender process that sends the first `cut` bytes of `stream` to the replica server at
// `port` and SIGKILLs itself: everything is made before the fork, and the child makes only
// system calls (the test process has threads).
pid_t SendAndDie(std::uint16_t port, const std::string& stream, std::size_t cut) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) ::_exit(2);
  // The greeting and "ok" to the proof, one byte at a time (nothing of ours is read past them).
  const auto line = [fd] {
    for (char c = 0; c != '\n';) {
      if (::read(fd, &c, 1) != 1) ::_exit(3);
    }
  };
  line();
  if (::write(fd, "auth -\n", 7) != 7) ::_exit(4);
  line();
  for (std::size_t sent = 0; sent < cut;) {
    const ssize_t n = ::write(fd, stream.data() + sent, cut - sent);
    if (n <= 0) ::_exit(5);
    sent += static_cast<std::size_t>(n);
  }
  ::kill(::getpid(), SIGKILL);
  ::_exit(6);
}

TEST_CASE("soak: a sender SIGKILLed at any moment of a copy leaves the peer's copies whole") {
  auto replicas = Replicas::Listen("");
  REQUIRE(replicas.ok());
  const std::uint16_t port = (*replicas)->port();
  constexpr std::size_t kBytes = 1 << 20;
  const unsigned seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::vector<std::uint64_t> whole;  // the steps sent whole, in order
  for (std::uint64_t step = 1; step <= 200; ++step) {
    const auto copy = SealedCopy(2, step, kBytes);
    std::string stream = "put " + std::to_string(copy.size()) + "\n";
    const std::size_t header = stream.size();
    stream.append(reinterpret_cast<const char*>(copy.data()), copy.size());
    // The worst moments in turn: nothing, inside the request line, inside the snapshot's
    // header, one byte short, all of it (twice in 12); else anywhere (the seed says where).
    const std::size_t moments[] = {0,
                                   header / 2,
                                   header + snap::kHeaderBytes / 2,
                                   header + snap::kHeaderBytes,
                                   stream.size() - 1,
                                   stream.size(),
                                   stream.size()};
    const std::size_t pick = step % 12;
    const std::size_t cut = pick < std::size(moments) ? moments[pick] : rng() % stream.size();
    INFO("step " << step << ", " << cut << " of " << stream.size() << " bytes sent");
    const pid_t pid = SendAndDie(port, stream, cut);
    REQUIRE(pid > 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);
    if (cut == stream.size()) whole.push_back(step);
    // Every whole copy arrives (they are counted as kept); a cut one never is.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while ((*replicas)->counters().received < whole.size() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE((*replicas)->counters().received == whole.size());
    // The peer offers the two newest whole copies, and each is the copy as it was sent.
    RawPeer reader(port);
    REQUIRE(reader.Line() == "ok");
    reader.Send("steps 2 4\n");
    std::string want = "ok";
    for (std::size_t i = whole.size(); i > 0 && i + 2 > whole.size(); --i) {
      want += (i == whole.size() ? " " : ",") + std::to_string(whole[i - 1]);
    }
    REQUIRE(reader.Line() == want);
    if (whole.empty()) continue;
    reader.Send("get 2 " + std::to_string(whole.back()) + "\n");
    const auto sent = SealedCopy(2, whole.back(), kBytes);
    REQUIRE(reader.Line() == "ok " + std::to_string(sent.size()));
    std::vector<char> got(sent.size());
    auto n = reader.link.Recv(got.data(), got.size(), got.size(),
                              DeadlineAfter(std::chrono::seconds(5)), "peer");
    REQUIRE(n.ok());
    REQUIRE(std::memcmp(got.data(), sent.data(), sent.size()) == 0);
  }
  CHECK(whole.size() == 34);  // 2 in 12 were sent whole
}

TEST_CASE("over TLS, copies are served to a peer that proves the token for its own session") {
  auto tls = PeerTls::Make(Security{});  // no certificate of its own: one made for it
  REQUIRE(tls.ok());
  CHECK_FALSE((*tls)->verifies());
  auto replicas = Replicas::Listen("job-secret", *tls);
  REQUIRE(replicas.ok());
  const std::uint16_t port = (*replicas)->port();
  {
    RawPeer peer(port, "", *tls, "job-secret");
    CHECK(peer.Line() == "ok");
    CHECK(peer.Put(SealedCopy(2, 4, 300000)) == "ok");
    peer.Send("get 2 4\n");
    const auto want = SealedCopy(2, 4, 300000);
    CHECK(peer.Line() == "ok " + std::to_string(want.size()));
    std::vector<char> got(want.size());
    auto n = peer.link.Recv(got.data(), got.size(), got.size(),
                            DeadlineAfter(std::chrono::seconds(5)), "peer");
    REQUIRE(n.ok());
    CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
  }
  // The token's proof without this session's binding, as a relay in the middle would pass on
  // a proof made for its own session: refused.
  RawPeer relayed(port, "", *tls, "job-secret", /*bind=*/false);
  CHECK(relayed.Line() == "error refused: not this job's token");
  // A peer that speaks plain TCP: no TLS session, refused, and the server goes on.
  {
    auto c = ConnectTcp("127.0.0.1", port, DeadlineAfter(std::chrono::seconds(5)));
    REQUIRE(c.ok());
    REQUIRE(SendAll(c->get(), "auth -\n", DeadlineAfter(std::chrono::seconds(5)), "peer").ok());
    char b[64];
    auto n = RecvSome(c->get(), b, 1, sizeof b, DeadlineAfter(std::chrono::seconds(5)), "peer");
    if (n.ok()) CHECK(std::string_view(b, *n).find("crun-replica") == std::string_view::npos);
  }
  RawPeer again(port, "", *tls, "job-secret");
  CHECK(again.Line() == "ok");
  again.Send("steps 2 4\n");
  CHECK(again.Line() == "ok 4");
  CHECK((*replicas)->counters().refused == 2);
}

// Two ends of a socket pair with a TLS session between them.
std::pair<PeerLink, PeerLink> TlsPair(const std::shared_ptr<PeerTls>& tls) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  PeerLink server{UniqueFd(sv[0])}, client{UniqueFd(sv[1])};
  const auto deadline = DeadlineAfter(std::chrono::seconds(10));
  Status accepted;
  std::thread t([&] { accepted = server.Handshake(tls, true, deadline, "client"); });
  const Status connected = client.Handshake(tls, false, deadline, "server");
  t.join();
  REQUIRE(accepted.ok());
  REQUIRE(connected.ok());
  return {std::move(server), std::move(client)};
}

TEST_CASE("a TLS write to a peer that has gone fails the link, not the process") {
  auto tls = PeerTls::Make(Security{});
  REQUIRE(tls.ok());
  // As a program that embeds the agent may leave it: SIGPIPE at its default, which kills.
  struct sigaction dfl {
  }, before{};
  dfl.sa_handler = SIG_DFL;
  REQUIRE(::sigaction(SIGPIPE, &dfl, &before) == 0);
  auto [server, client] = TlsPair(*tls);
  const auto deadline = DeadlineAfter(std::chrono::seconds(10));
  server.reset();  // the peer dies
  // Bigger than the socket's buffer, so some write meets the closed end.
  const Status sent = client.Send(std::string(4 << 20, 'x'), deadline, "10.0.0.7:29500");
  CHECK_FALSE(sent.ok());
  CHECK_THAT(sent.message(), Catch::Contains("10.0.0.7:29500"));
  char c;
  CHECK_FALSE(client.Recv(&c, 1, 1, deadline, "10.0.0.7:29500").ok());
  REQUIRE(::sigaction(SIGPIPE, &before, nullptr) == 0);
}

TEST_CASE("a TLS session's binding is the same on both ends and differs between sessions") {
  auto tls = PeerTls::Make(Security{});
  REQUIRE(tls.ok());
  const auto session = [&] {
    auto [server, client] = TlsPair(*tls);
    const auto deadline = DeadlineAfter(std::chrono::seconds(10));
    CHECK(server.Binding().size() == 64);
    CHECK(server.Binding() == client.Binding());
    // Bytes both ways, larger than one TLS record.
    const std::string big(3 << 20, 'z');
    bool sent = false;  // Catch2's assertions are not thread-safe: checked after the join
    std::thread w([&] { sent = client.Send(big, deadline, "server").ok(); });
    std::string got(big.size(), '\0');
    CHECK(server.Recv(got.data(), got.size(), got.size(), deadline, "client").ok());
    w.join();
    CHECK(sent);
    CHECK(got == big);
    return server.Binding();
  };
  CHECK(session() != session());
  // A handshake whose peer never answers ends at its deadline, naming the peer.
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd silent(sv[1]);
  PeerLink lonely{UniqueFd(sv[0])};
  const Status s =
      lonely.Handshake(*tls, false, DeadlineAfter(std::chrono::milliseconds(200)), "10.0.0.9:4242");
  CHECK(s.code() == StatusCode::kTimeout);
  CHECK_THAT(s.message(), Catch::Contains("10.0.0.9:4242"));
}

}  // namespace
}  // namespace crun::agent
