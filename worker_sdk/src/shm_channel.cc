#include "worker_sdk/src/shm_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <random>
#include <sstream>

#include "base/proc.h"
#include "worker_sdk/src/reduce.h"

namespace crun::worker {
namespace {

constexpr int kMaxRanks = 64;
constexpr std::uint64_t kMagic = 0x6d68732d6e757263ULL;  // "crun-shm", little-endian
// Each rank's slot: a collective larger than this runs in chunks of it. There are two sets
// of slots, used by turns from one chunk to the next, so a rank may fill its slot for the
// next chunk while a slower one still reads the last: a chunk then needs a single barrier
// (two for allreduce, whose middle phase writes the slots).
//
// 1 MiB for 2 ranks, growing with the group: the more ranks, the likelier one of them is
// descheduled at a barrier (more ranks than cores is common on CPU hosts), so fewer, larger
// chunks pay off; the whole segment stays within 32 MiB. Measured on 2 vCPUs: 4 ranks moved
// a 256 MiB allreduce in 520 ms with 1 MiB slots and in 170 ms with 2 MiB ones.
std::size_t SlotBytes(int size) {
  const std::size_t mib = std::size_t{1} << 20;
  const std::size_t by_ranks = std::clamp<std::size_t>(static_cast<std::size_t>(size) / 2, 1, 4);
  const std::size_t cap = std::max<std::size_t>(1, 16 / static_cast<std::size_t>(size));
  return std::min(by_ranks, cap) * mib;
}
constexpr std::size_t kHeaderBytes = 8192;
// How long a waiter spins before it sleeps: long enough for a peer that is already on its way
// (the usual case inside a collective), short enough to cost nothing next to a training step.
constexpr auto kSpin = std::chrono::microseconds(50);
// A sleeping waiter wakes at least this often to see whether the peer it waits for is alive.
constexpr auto kLivenessPoll = std::chrono::milliseconds(20);

// Who broke the channel, and how: stored as (rank + 1) | reason << 16.
constexpr std::uint32_t kLeft = 1;    // the rank's group was destroyed
constexpr std::uint32_t kFailed = 2;  // an error or Abort() there

struct alignas(64) Counter {
  std::atomic<std::uint64_t> value;
};

}  // namespace

struct ShmChannel::Segment {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint64_t pid_namespace;
  std::uint64_t slot_bytes;
  std::int32_t size;
  std::atomic<std::uint32_t> broken;    // 0 while usable
  std::atomic<std::uint32_t> sleepers;  // waiters inside futex_wait (or about to be)
  std::atomic<std::uint32_t> wake_seq;  // the futex word
  std::int32_t pids[kMaxRanks];
  Counter arrived[kMaxRanks];  // per rank: how many times it has arrived
};
static_assert(sizeof(ShmChannel::Segment) <= kHeaderBytes, "header outgrew its page");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free &&
                  std::atomic<std::uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");

namespace {

std::uint64_t PidNamespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino) ^ (static_cast<std::uint64_t>(st.st_dev) << 32);
}

std::size_t SegmentBytes(int size) {
  return kHeaderBytes + 2 * static_cast<std::size_t>(size) * SlotBytes(size);
}

void FutexWait(std::atomic<std::uint32_t>* word, std::uint32_t seen,
               std::chrono::nanoseconds for_at_most) {
  struct timespec ts {};
  ts.tv_sec = static_cast<time_t>(for_at_most.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(for_at_most.count() % 1'000'000'000);
  // Not FUTEX_PRIVATE: the word is shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Alive: the pid exists and is not a zombie (a worker that died but is not yet reaped).
bool Alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  return ProcessState(pid) != 'Z';  // no /proc: trust kill()
}

std::string Hex(std::uint64_t v) {
  std::ostringstream o;
  o << std::hex << v;
  return o.str();
}

// Maps an open segment file.
StatusOr<ShmChannel::Segment*> Map(int fd, std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return PosixError("mmap", errno);
  return static_cast<ShmChannel::Segment*>(p);
}

// Rank 0: a fresh segment with its pages reserved now, so a full /dev/shm is a clear "no"
// here and never a SIGBUS in the middle of a collective.
StatusOr<ShmChannel::Segment*> Create(int size, const std::string& name, std::uint64_t token) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return PosixError("shm_open " + name, errno);
  const std::size_t bytes = SegmentBytes(size);
  StatusOr<ShmChannel::Segment*> mapped = ResourceExhausted("not mapped");
  const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    mapped = PosixError("cannot reserve " + std::to_string(bytes >> 20) + " MiB in /dev/shm", rc);
  } else {
    mapped = Map(fd, bytes);
  }
  ::close(fd);
  if (!mapped.ok()) {
    ::shm_unlink(name.c_str());
    return mapped.status();
  }
  ShmChannel::Segment* seg = *mapped;
  // The file is zero-filled: the atomics start at 0.
  seg->token = token;
  seg->pid_namespace = PidNamespace();
  seg->slot_bytes = SlotBytes(size);
  seg->size = size;
  seg->pids[0] = static_cast<std::int32_t>(::getpid());
  std::atomic_thread_fence(std::memory_order_release);
  seg->magic = kMagic;
  return seg;
}

// Ranks 1..n-1: the offered segment, if this process can see it and it is the one offered.
StatusOr<ShmChannel::Segment*> Attach(const std::string& name, std::uint64_t token, int rank,
                                      int size) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return PosixError("shm_open " + name + " (another host or mount namespace?)", errno);
  const std::size_t bytes = SegmentBytes(size);
  struct stat st {};
  StatusOr<ShmChannel::Segment*> mapped = Unavailable(name + " has an unexpected size");
  if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == bytes) {
    mapped = Map(fd, bytes);
  }
  ::close(fd);
  if (!mapped.ok()) return mapped.status();
  ShmChannel::Segment* seg = *mapped;
  std::atomic_thread_fence(std::memory_order_acquire);
  Status refused;
  if (seg->magic != kMagic || seg->token != token || seg->size != size ||
      seg->slot_bytes != SlotBytes(size)) {
    refused = Unavailable(name + " is not the segment rank 0 offered");
  } else if (seg->pid_namespace != PidNamespace()) {
    refused = Unavailable("rank 0 runs in another pid namespace");
  } else {
    seg->pids[rank] = static_cast<std::int32_t>(::getpid());
    return seg;
  }
  ::munmap(seg, bytes);
  return refused;
}

}  // namespace

StatusOr<ShmChannel::Connection> ShmChannel::Connect(Store& store, const std::string& key_prefix,
                                                     int rank, int size, bool willing,
                                                     Millis timeout) {
  if (size < 2 || size > kMaxRanks) {
    return Connection{nullptr,
                      size < 2 ? "one rank" : "more than " + std::to_string(kMaxRanks) + " ranks"};
  }
  const std::string offer_key = key_prefix + "offer";
  Segment* seg = nullptr;
  std::string name;
  std::string why;
  if (rank == 0) {
    std::random_device rd;
    const std::uint64_t token = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    name = "/crun-" + std::to_string(::getpid()) + "-" + Hex(token);
    if (willing) {
      auto created = Create(size, name, token);
      seg = created.ok() ? *created : nullptr;
      if (!created.ok()) why = created.status().message();
    } else {
      why = "shared memory is turned off";
    }
    CRUN_RETURN_IF_ERROR(
        store.Set(offer_key, seg != nullptr ? "ok " + name + " " + Hex(token) : "no " + why));
  } else {
    CRUN_RETURN_IF_ERROR(store.Wait({offer_key}, timeout));
    auto offer = store.Get(offer_key);
    CRUN_RETURN_IF_ERROR(offer.status());
    std::istringstream in(*offer);
    std::string verdict;
    std::string token_hex;
    in >> verdict >> name >> token_hex;
    if (!willing) {
      why = "shared memory is turned off";
    } else if (verdict == "ok") {
      std::uint64_t token = 0;
      const char* end = token_hex.data() + token_hex.size();
      const auto parsed = std::from_chars(token_hex.data(), end, token, 16);
      if (token_hex.empty() || parsed.ec != std::errc() || parsed.ptr != end) {
        why = "rank 0's offer '" + *offer + "' is malformed";  // not ours to throw on
      } else {
        auto attached = Attach(name, token, rank, size);
        seg = attached.ok() ? *attached : nullptr;
        if (!attached.ok()) why = attached.status().message();
      }
    } else {
      why = "rank 0: " + offer->substr(std::min<std::size_t>(3, offer->size()));
    }
    CRUN_RETURN_IF_ERROR(store.Set(key_prefix + "answer/" + std::to_string(rank),
                                   seg != nullptr ? "ok" : "no " + why));
  }
  // Everyone reads every answer, so all ranks decide alike.
  std::vector<std::string> keys;
  for (int r = 1; r < size; ++r) keys.push_back(key_prefix + "answer/" + std::to_string(r));
  Status answered = store.Wait(keys, timeout);
  std::string refusal;
  for (int r = 1; r < size && answered.ok() && refusal.empty(); ++r) {
    auto answer = store.Get(keys[static_cast<std::size_t>(r - 1)]);
    if (!answer.ok()) {
      answered = answer.status();
    } else if (*answer != "ok") {
      refusal = "rank " + std::to_string(r) + ": " +
                answer->substr(std::min<std::size_t>(3, answer->size()));
    }
  }
  // Everyone has opened it (or never will): the name is no longer needed, and a segment
  // without a name disappears with the last process that maps it.
  if (rank == 0 && !name.empty() && seg != nullptr) ::shm_unlink(name.c_str());
  if (!answered.ok() || !refusal.empty() || seg == nullptr) {
    if (seg != nullptr) ::munmap(seg, SegmentBytes(size));
    CRUN_RETURN_IF_ERROR(answered);
    return Connection{nullptr, refusal.empty() ? why : refusal};
  }
  return Connection{std::unique_ptr<ShmChannel>(
                        new ShmChannel(seg, SegmentBytes(size), rank, size)),
                    ""};
}

ShmChannel::ShmChannel(Segment* segment, std::size_t mapped_bytes, int rank, int size)
    : seg_(segment),
      mapped_bytes_(mapped_bytes),
      slot_bytes_(SlotBytes(size)),
      rank_(rank),
      size_(size) {}

ShmChannel::~ShmChannel() {
  std::uint32_t expected = 0;
  seg_->broken.compare_exchange_strong(expected,
                                       static_cast<std::uint32_t>(rank_ + 1) | kLeft << 16);
  seg_->wake_seq.fetch_add(1);
  FutexWakeAll(&seg_->wake_seq);
  ::munmap(seg_, mapped_bytes_);
}

void ShmChannel::Break() {
  std::uint32_t expected = 0;
  seg_->broken.compare_exchange_strong(expected,
                                       static_cast<std::uint32_t>(rank_ + 1) | kFailed << 16);
  seg_->wake_seq.fetch_add(1);
  FutexWakeAll(&seg_->wake_seq);
}

std::uint8_t* ShmChannel::Slot(int rank) const {
  const std::size_t index =
      (chunks_ % 2) * static_cast<std::size_t>(size_) + static_cast<std::size_t>(rank);
  return reinterpret_cast<std::uint8_t*>(seg_) + kHeaderBytes + index * slot_bytes_;
}

void ShmChannel::Arrive() {
  seg_->arrived[rank_].value.store(++epoch_);
  if (seg_->sleepers.load() != 0) {
    seg_->wake_seq.fetch_add(1);
    FutexWakeAll(&seg_->wake_seq);
  }
}

Status ShmChannel::Failure(std::uint32_t broken, int missing) const {
  const int by = static_cast<int>(broken & 0xffff) - 1;
  const std::uint32_t how = broken >> 16;
  if (by == rank_) return Unavailable("this rank broke the group");
  if (how == kLeft) {
    return Unavailable("rank " + std::to_string(by) +
                       " left the group (its group was "
                       "destroyed or its process ended)");
  }
  if (broken != 0) {
    return Unavailable("rank " + std::to_string(by) + " broke the group (an error or abort there)");
  }
  return Unavailable("rank " + std::to_string(missing) + " (pid " +
                     std::to_string(seg_->pids[missing]) + ") exited");
}

// Waits until every rank has arrived as often as this one. A peer that broke the channel,
// died, or misses the deadline ends the wait with an error; what arrived before the channel
// broke still counts, so a peer finishing its last collective and leaving is no failure.
Status ShmChannel::WaitAll(Deadline deadline) {
  const std::uint64_t target = epoch_;
  int missing = 0;
  auto all_arrived = [&] {
    for (int r = 0; r < size_; ++r) {
      if (seg_->arrived[r].value.load(std::memory_order_acquire) < target) {
        missing = r;
        return false;
      }
    }
    return true;
  };
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  for (unsigned i = 1;; ++i) {
    if (all_arrived()) return Status::Ok();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= spin_until) break;
      ::sched_yield();  // oversubscribed hosts: let the awaited rank run
    } else {
      CpuRelax();
    }
  }
  for (;;) {
    seg_->sleepers.fetch_add(1);
    const std::uint32_t seen = seg_->wake_seq.load();
    Status result = Status::Ok();
    bool done = all_arrived();
    if (!done) {
      const std::uint32_t broken = seg_->broken.load();
      const auto now = std::chrono::steady_clock::now();
      if (broken != 0) {
        result = Failure(broken, missing);
        done = true;
      } else if (!Alive(seg_->pids[missing])) {
        result = Failure(0, missing);
        done = true;
      } else if (now >= deadline) {
        std::string late;
        for (int r = 0; r < size_; ++r) {
          if (seg_->arrived[r].value.load() < target) {
            late += (late.empty() ? "" : ", ") + std::to_string(r);
          }
        }
        result =
            Status(StatusCode::kTimeout, "Timed out (shared memory) waiting for rank(s) " + late);
        done = true;
      } else {
        FutexWait(&seg_->wake_seq, seen,
                  std::min<std::chrono::nanoseconds>(deadline - now, kLivenessPoll));
      }
    }
    seg_->sleepers.fetch_sub(1);
    if (done) {
      if (!result.ok()) Break();
      return result;
    }
  }
}

Status ShmChannel::AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                             Deadline deadline) {
  if (const auto b = seg_->broken.load(); b != 0) return Failure(b, 0);
  const std::size_t es = SizeOf(dtype);
  const std::size_t chunk = slot_bytes_ / es;
  const ReduceFn reduce = ReduceFunc(dtype, op);
  auto* base = static_cast<std::uint8_t*>(data);
  for (std::size_t off = 0; off < count; off += chunk) {
    const std::size_t n = std::min(chunk, count - off);
    std::uint8_t* mine = base + off * es;
    std::memcpy(Slot(rank_), mine, n * es);
    Arrive();
    CRUN_RETURN_IF_ERROR(WaitAll(deadline));
    // Rank r reduces piece r of every slot into its own slot's piece r: no other rank reads
    // or writes piece r in this phase.
    const std::size_t per =
        (n + static_cast<std::size_t>(size_) - 1) / static_cast<std::size_t>(size_);
    auto piece = [&](int r) { return std::min(n, per * static_cast<std::size_t>(r)); };
    const std::size_t lo = piece(rank_);
    const std::size_t hi = piece(rank_ + 1);
    if (hi > lo) {
      std::uint8_t* acc = Slot(rank_) + lo * es;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) reduce(acc, acc, Slot(r) + lo * es, hi - lo);
      }
      if (op == ReduceOp::kAvg) Scale(acc, hi - lo, dtype, 1.0 / size_);
    }
    Arrive();
    CRUN_RETURN_IF_ERROR(WaitAll(deadline));
    for (int r = 0; r < size_; ++r) {
      const std::size_t a = piece(r);
      const std::size_t b = piece(r + 1);
      if (b > a) std::memcpy(mine + a * es, Slot(r) + a * es, (b - a) * es);
    }
    ++chunks_;
  }
  return Status::Ok();
}

Status ShmChannel::ReduceScatter(const void* in, void* out, std::size_t count, DType dtype,
                                 ReduceOp op, Deadline deadline) {
  if (const auto b = seg_->broken.load(); b != 0) return Failure(b, 0);
  const std::size_t es = SizeOf(dtype);
  const std::size_t chunk = slot_bytes_ / (es * static_cast<std::size_t>(size_));
  const ReduceFn reduce = ReduceFunc(dtype, op);
  const auto* src = static_cast<const std::uint8_t*>(in);
  auto* dst = static_cast<std::uint8_t*>(out);
  for (std::size_t off = 0; off < count; off += chunk) {
    const std::size_t n = std::min(chunk, count - off);
    for (int b = 0; b < size_; ++b) {
      std::memcpy(Slot(rank_) + static_cast<std::size_t>(b) * n * es,
                  src + (static_cast<std::size_t>(b) * count + off) * es, n * es);
    }
    Arrive();
    CRUN_RETURN_IF_ERROR(WaitAll(deadline));
    const std::size_t mine = static_cast<std::size_t>(rank_) * n * es;
    std::uint8_t* acc = dst + off * es;
    reduce(acc, Slot(0) + mine, Slot(1) + mine, n);
    for (int r = 2; r < size_; ++r) reduce(acc, acc, Slot(r) + mine, n);
    if (op == ReduceOp::kAvg) Scale(acc, n, dtype, 1.0 / size_);
    ++chunks_;
  }
  return Status::Ok();
}

Status ShmChannel::AllGather(const void* in, void* out, std::size_t bytes, Deadline deadline) {
  if (const auto b = seg_->broken.load(); b != 0) return Failure(b, 0);
  const auto* src = static_cast<const std::uint8_t*>(in);
  auto* dst = static_cast<std::uint8_t*>(out);
  for (std::size_t off = 0; off < bytes; off += slot_bytes_) {
    const std::size_t n = std::min(slot_bytes_, bytes - off);
    std::memcpy(Slot(rank_), src + off, n);
    Arrive();
    CRUN_RETURN_IF_ERROR(WaitAll(deadline));
    for (int r = 0; r < size_; ++r) {
      std::memcpy(dst + static_cast<std::size_t>(r) * bytes + off, Slot(r), n);
    }
    ++chunks_;
  }
  return Status::Ok();
}

Status ShmChannel::Broadcast(void* data, std::size_t bytes, int root, Deadline deadline) {
  if (const auto b = seg_->broken.load(); b != 0) return Failure(b, 0);
  auto* p = static_cast<std::uint8_t*>(data);
  for (std::size_t off = 0; off < bytes; off += slot_bytes_) {
    const std::size_t n = std::min(slot_bytes_, bytes - off);
    if (rank_ == root) std::memcpy(Slot(root), p + off, n);
    Arrive();
    CRUN_RETURN_IF_ERROR(WaitAll(deadline));
    if (rank_ != root) std::memcpy(p + off, Slot(root), n);
    ++chunks_;
  }
  return Status::Ok();
}

Status ShmChannel::Barrier(Deadline deadline) {
  if (const auto b = seg_->broken.load(); b != 0) return Failure(b, 0);
  Arrive();
  return WaitAll(deadline);
}

}  // namespace crun::worker
