#include "agent/snapshots/node_snapshots.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "agent/supervise/worker_cgroup.h"
#include "base/numbers.h"
#include "base/text.h"

namespace crun::agent {
namespace {

namespace snap = crun::snapshot;

std::optional<std::uint64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  const auto v = ParseInteger(Trim(text), 0, INT64_MAX);
  if (!v) return std::nullopt;  // "max", or unreadable
  return static_cast<std::uint64_t>(*v);
}

std::optional<std::uint64_t> MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::uint64_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

std::uint64_t SnapshotChecksum(const snap::BufferHeader& h, const unsigned char* payload,
                               std::uint64_t n) {
  const std::uint64_t seed =
      (h.step * 0x9E3779B97F4A7C15ULL) ^ (static_cast<std::uint64_t>(h.rank) << 20) ^
      (static_cast<std::uint64_t>(h.world_size) << 42) ^ h.toc_bytes ^ h.layout;
  return XXH3_64bits_withSeed(payload, static_cast<std::size_t>(n), seed);
}

Status CheckRoom(const std::string& what, std::uint64_t bytes, const std::string& dir,
                 const std::string& cgroup_dir) {
  const std::string needs = what + " needs " + FormatBytes(bytes) + ", but ";
  struct statvfs fs {};
  if (!dir.empty() && ::statvfs(dir.c_str(), &fs) != 0) {
    return PosixError("snapshot memory " + dir, errno);
  }
  const std::uint64_t free = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
  const std::uint64_t total = static_cast<std::uint64_t>(fs.f_blocks) * fs.f_frsize;
  if (!dir.empty() && bytes > free) {
    return ResourceExhausted(needs + dir + " has " + FormatBytes(free) + " free (of " +
                             FormatBytes(total) +
                             "): make room there, point --snapshot-memory at a larger tmpfs, or "
                             "save less");
  }
  // The cgroup that will be charged (crun's) and every parent up to the mount point.
  const std::string mount_hint = "/sys/fs/cgroup";
  for (std::string cg = cgroup_dir.empty() ? OwnCgroupDir() : cgroup_dir; !cg.empty();) {
    const auto max = ReadNumber(cg + "/memory.max");
    const auto current = ReadNumber(cg + "/memory.current");
    if (max && current && *current + bytes > *max) {
      return ResourceExhausted(needs + "the cgroup " + cg + " (crun's, which is charged) holds " +
                               FormatBytes(*current) + " of its memory.max " + FormatBytes(*max) +
                               ": raise the limit or save less");
    }
    const auto slash = cg.rfind('/');
    if (slash == std::string::npos || slash == 0 || cg.size() <= mount_hint.size()) break;
    cg.resize(slash);
  }
  if (const auto avail = MemAvailable(); avail && bytes > *avail) {
    return ResourceExhausted(needs + "the machine has " + FormatBytes(*avail) +
                             " of memory available (MemAvailable)");
  }
  return Status::Ok();
}

StatusOr<std::shared_ptr<SnapshotBuffer>> SnapshotBuffer::Create(const std::string& dir,
                                                                 std::uint64_t capacity) {
  const std::uint64_t size = snap::kHeaderBytes + snap::AlignUp(capacity);
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return PosixError("snapshot memory " + dir + " (an unnamed file in it; a tmpfs is needed)",
                      errno);
  }
  // Every page now, by crun: charged to crun's cgroup, and a full tmpfs is refused here
  // rather than with a SIGBUS in the worker that writes.
  if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); rc != 0) {
    ::close(fd);
    return PosixError("allocating " + FormatBytes(size) + " of snapshot memory in " + dir, rc,
                      StatusCode::kResourceExhausted);
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return PosixError("mapping snapshot memory", err);
  }
  // The guard and every child crun forks must not hold the memory.
  ::madvise(base, size, MADV_DONTFORK);
  auto* h = static_cast<snap::BufferHeader*>(base);
  std::memcpy(h->magic, snap::kMagic, sizeof snap::kMagic);
  h->version = snap::kVersion;
  snap::StoreState(*h, snap::kEmpty);
  return std::shared_ptr<SnapshotBuffer>(new SnapshotBuffer(fd, base, snap::AlignUp(capacity)));
}

SnapshotBuffer::~SnapshotBuffer() {
  ::munmap(base_, snap::kHeaderBytes + capacity_);
  ::close(fd_);
}

const char* Name(BufferVerdict v) {
  switch (v) {
    case BufferVerdict::kNone:
      return "none";
    case BufferVerdict::kIncomplete:
      return "incomplete";
    case BufferVerdict::kValid:
      return "valid";
    case BufferVerdict::kSealed:
      return "sealed";
    case BufferVerdict::kCorrupt:
      return "corrupt";
  }
  return "?";
}

NodeSnapshots::NodeSnapshots(SnapshotMemoryOptions options) : options_(std::move(options)) {}
NodeSnapshots::~NodeSnapshots() = default;

StatusOr<std::shared_ptr<SnapshotBuffer>> NodeSnapshots::Reserve(int local_rank, int index,
                                                                 std::uint64_t bytes) {
  if (index != 0 && index != 1) {
    return InvalidArgument("snapshot buffer index " + std::to_string(index) + " (0 or 1)");
  }
  std::shared_ptr<SnapshotBuffer> old;
  {
    std::lock_guard lock(mu_);
    auto& slot = slots_[local_rank];
    old = slot[static_cast<std::size_t>(index)];
    if (old && old->capacity() >= bytes) return old;
    const snap::BufferHeader* a = slot[0] ? &slot[0]->header() : nullptr;
    const snap::BufferHeader* b = slot[1] ? &slot[1]->header() : nullptr;
    if (old && snap::TargetBuffer(a, b) != index) {
      return InvalidArgument("local rank " + std::to_string(local_rank) + "'s snapshot buffer " +
                             std::to_string(index) +
                             " holds its newest complete snapshot: a save writes the other one");
    }
  }
  const std::string what = "local rank " + std::to_string(local_rank) + "'s snapshot buffer";
  const std::uint64_t adding = snap::kHeaderBytes + snap::AlignUp(bytes);
  // The new buffer is made before the old one goes: it needs its whole size.
  CRUN_RETURN_IF_ERROR(CheckRoom(what, adding, options_.dir, options_.cgroup_dir));
  auto made = SnapshotBuffer::Create(options_.dir, bytes);
  if (!made.ok()) return made.status();
  std::lock_guard lock(mu_);
  slots_[local_rank][static_cast<std::size_t>(index)] = *made;
  return *made;
}

std::array<std::shared_ptr<SnapshotBuffer>, 2> NodeSnapshots::Slot(int local_rank) const {
  std::lock_guard lock(mu_);
  const auto it = slots_.find(local_rank);
  if (it == slots_.end()) return {};
  return it->second;
}

BufferCheck NodeSnapshots::CheckBuffer(const std::shared_ptr<SnapshotBuffer>& b, bool verify) {
  BufferCheck c;
  if (!b) return c;
  c.capacity = b->capacity();
  snap::BufferHeader& h = b->header();
  const std::uint32_t state = snap::LoadState(h);
  if (state != snap::kComplete) {
    c.verdict = BufferVerdict::kIncomplete;
    return c;
  }
  const std::uint64_t generation = h.generation;
  c.step = h.step;
  c.generation = generation;
  c.rank = h.rank;
  const std::uint64_t n = h.payload_bytes;
  if (n > b->capacity()) {
    c.verdict = BufferVerdict::kCorrupt;
    return c;
  }
  const bool sealed =
      std::atomic_ref<std::uint64_t>(h.checksum_generation).load(std::memory_order_acquire) ==
      generation;
  if (sealed && !verify) {
    c.verdict = BufferVerdict::kSealed;
    return c;
  }
  const std::uint64_t sum = SnapshotChecksum(h, b->payload(), n);
  // A writer that began a new save meanwhile makes this hash worthless: the buffer is not
  // complete any more, or holds another generation.
  if (snap::LoadState(h) != snap::kComplete || h.generation != generation) {
    c.verdict = BufferVerdict::kIncomplete;
    return c;
  }
  if (sealed) {
    c.verdict = sum == h.checksum ? BufferVerdict::kValid : BufferVerdict::kCorrupt;
    return c;
  }
  h.checksum = sum;
  std::atomic_ref<std::uint64_t>(h.checksum_generation)
      .store(generation, std::memory_order_release);
  c.verdict = BufferVerdict::kValid;
  return c;
}

void NodeSnapshots::Seal(int local_rank, int index) {
  const auto slot = Slot(local_rank);
  if (index == 0 || index == 1) CheckBuffer(slot[static_cast<std::size_t>(index)], false);
}

std::array<BufferCheck, 2> NodeSnapshots::Check(int local_rank) {
  const auto slot = Slot(local_rank);
  // The newest complete one is what a load takes, unless another rank lacks it.
  const int older = snap::TargetBuffer(slot[0] ? &slot[0]->header() : nullptr,
                                       slot[1] ? &slot[1]->header() : nullptr);
  std::array<BufferCheck, 2> out;
  out[static_cast<std::size_t>(1 - older)] =
      CheckBuffer(slot[static_cast<std::size_t>(1 - older)], true);
  out[static_cast<std::size_t>(older)] = CheckBuffer(slot[static_cast<std::size_t>(older)], false);
  return out;
}

BufferCheck NodeSnapshots::Verify(int local_rank, int index) {
  if (index != 0 && index != 1) return {};
  return CheckBuffer(Slot(local_rank)[static_cast<std::size_t>(index)], true);
}

BufferCheck NodeSnapshots::Stage(int local_rank, int index, std::vector<unsigned char>* staged) {
  BufferCheck c;
  if (index != 0 && index != 1) return c;
  const auto b = Slot(local_rank)[static_cast<std::size_t>(index)];
  if (!b) return c;
  c.capacity = b->capacity();
  snap::BufferHeader& h = b->header();
  c.verdict = BufferVerdict::kIncomplete;
  if (snap::LoadState(h) != snap::kComplete) return c;
  const std::uint64_t generation = h.generation;
  const std::uint64_t n = h.payload_bytes;
  if (n > b->capacity()) return c;
  staged->resize(snap::kHeaderBytes + n);
  std::memcpy(staged->data(), &h, snap::kHeaderBytes);
  std::memcpy(staged->data() + snap::kHeaderBytes, b->payload(), n);
  std::atomic_thread_fence(std::memory_order_acquire);
  // The copy is whole when no new save began while it was taken.
  if (snap::LoadState(h) != snap::kComplete || h.generation != generation) return c;
  auto* copy = reinterpret_cast<snap::BufferHeader*>(staged->data());
  if (copy->generation != generation || copy->payload_bytes != n) return c;
  const std::uint64_t sum = SnapshotChecksum(*copy, staged->data() + snap::kHeaderBytes, n);
  const bool sealed =
      std::atomic_ref<std::uint64_t>(h.checksum_generation).load(std::memory_order_acquire) ==
      generation;
  c.step = copy->step;
  c.generation = generation;
  c.rank = copy->rank;
  if (sealed && h.checksum != sum) {
    c.verdict = BufferVerdict::kCorrupt;
    return c;
  }
  if (!sealed) {
    h.checksum = sum;
    std::atomic_ref<std::uint64_t>(h.checksum_generation)
        .store(generation, std::memory_order_release);
  }
  copy->state = snap::kComplete;
  copy->checksum = sum;
  copy->checksum_generation = generation;
  c.verdict = BufferVerdict::kValid;
  return c;
}

bool NodeSnapshots::HoldsRank(int local_rank, std::int64_t rank) const {
  for (const auto& b : Slot(local_rank)) {
    if (b && snap::LoadState(b->header()) == snap::kComplete && b->header().rank == rank) {
      return true;
    }
  }
  return false;
}

std::optional<std::uint64_t> NodeSnapshots::CompleteStep(int local_rank, int index) const {
  if (index != 0 && index != 1) return std::nullopt;
  const auto b = Slot(local_rank)[static_cast<std::size_t>(index)];
  if (!b || snap::LoadState(b->header()) != snap::kComplete) return std::nullopt;
  return b->header().step;
}

StatusOr<int> NodeSnapshots::Fill(int local_rank, const snap::BufferHeader& from,
                                  const PayloadReader& read) {
  if (!snap::HasMagic(from)) return InvalidArgument("not a crun snapshot of this version");
  const std::uint64_t n = from.payload_bytes;
  const auto slot = Slot(local_rank);
  const snap::BufferHeader* a = slot[0] ? &slot[0]->header() : nullptr;
  const snap::BufferHeader* b = slot[1] ? &slot[1]->header() : nullptr;
  const int index = snap::TargetBuffer(a, b);
  const snap::BufferHeader* other = index == 0 ? b : a;
  const bool other_done = other != nullptr && snap::LoadState(*other) == snap::kComplete;
  CRUN_ASSIGN_OR_RETURN(auto buffer, Reserve(local_rank, index, n));
  snap::BufferHeader& h = buffer->header();
  snap::StoreState(h, snap::kWriting);
  if (Status got = read(const_cast<unsigned char*>(buffer->payload()), n); !got.ok()) {
    snap::StoreState(h, snap::kEmpty);
    return got;
  }
  const std::uint64_t generation = std::max(h.generation, other_done ? other->generation : 0) + 1;
  h.step = from.step;
  h.payload_bytes = n;
  h.toc_bytes = from.toc_bytes;
  h.rank = from.rank;
  h.world_size = from.world_size;
  h.layout = from.layout;
  h.saved_unix_ns = from.saved_unix_ns;
  h.generation = generation;
  h.checksum = from.checksum;
  std::atomic_ref<std::uint64_t>(h.checksum_generation)
      .store(generation, std::memory_order_release);
  snap::StoreState(h, snap::kComplete);
  const BufferCheck check = CheckBuffer(buffer, true);
  if (check.verdict != BufferVerdict::kValid) {
    snap::StoreState(h, snap::kEmpty);
    return InvalidArgument("the snapshot of rank " + std::to_string(from.rank) + " at step " +
                           std::to_string(from.step) + " fails its checksum");
  }
  return index;
}

std::uint64_t NodeSnapshots::allocated_bytes() const {
  std::lock_guard lock(mu_);
  std::uint64_t n = 0;
  for (const auto& [rank, slot] : slots_) {
    for (const auto& b : slot) {
      if (b) n += snap::kHeaderBytes + b->capacity();
    }
  }
  return n;
}

std::optional<std::uint64_t> NodeSnapshots::NodeStep() const {
  std::lock_guard lock(mu_);
  std::optional<std::uint64_t> node;
  for (const auto& [rank, slot] : slots_) {
    std::optional<std::uint64_t> newest;
    for (const auto& b : slot) {
      if (b && snap::LoadState(b->header()) == snap::kComplete) {
        newest = std::max(newest.value_or(0), b->header().step);
      }
    }
    if (!newest) return std::nullopt;
    node = node ? std::min(*node, *newest) : *newest;
  }
  return node;
}

void NodeSnapshots::Clear() {
  std::lock_guard lock(mu_);
  slots_.clear();
}

}  // namespace crun::agent
