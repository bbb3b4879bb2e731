// The node's snapshot memory (docs/checkpoints.md): for each local rank a slot of two buffers,
// each an unnamed file (O_TMPFILE) on a tmpfs (/dev/shm unless --snapshot-memory says
// otherwise) that crun creates, sizes and holds open for the whole job. Workers map the
// buffers crun hands them (snapshot_server.h) and write their snapshots there
// (crun/worker/snapshot_layout.h); crun seals each complete buffer with a checksum and checks it
// again before a load.
//
// Which cgroup pays: crun allocates every page of a buffer itself (fallocate) when it creates
// it, so the memory is charged to crun's own cgroup, never to an attempt's: a worker writing
// into the buffer touches pages that are already charged. Killing and removing an attempt's
// cgroup leaves the snapshot where it was.
//
// Nothing outlives the job: the files have no name, so the memory goes once the last holder
// closes them (crun's Clear() or its death; workers' mappings die with the workers, which the
// guard kills when crun is SIGKILLed).
//
// Thread-safe: Reserve and Open run on the agent's loop, Seal and Check on the sealer's thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <crun/worker/snapshot_layout.h>

#include "base/status.h"

namespace crun::agent {

struct SnapshotMemoryOptions {
  std::string dir = "/dev/shm";  // the tmpfs that holds the buffers
  // The cgroup directory whose memory.max (and its parents') bounds what crun may allocate;
  // "" finds crun's own.
  std::string cgroup_dir;
};

// Whether `bytes` more fit in `dir`'s file system, in the cgroup at `cgroup_dir` (and each of
// its parents) and in the machine's available memory; the refusal names the size, the limit
// and where it is, beginning with `what` ("local rank 0's snapshot buffer"). An empty `dir`:
// memory of crun's own (a peer's copies), no file system to ask.
Status CheckRoom(const std::string& what, std::uint64_t bytes, const std::string& dir,
                 const std::string& cgroup_dir);

// The checksum crun seals a snapshot with: the payload's XXH3-64, seeded with what the header
// says of it, so that a changed step, rank or world size fails the check as a changed byte does.
std::uint64_t SnapshotChecksum(const snapshot::BufferHeader& h, const unsigned char* payload,
                               std::uint64_t n);

// A buffer as crun holds it: its file and crun's mapping of it.
class SnapshotBuffer {
 public:
  static StatusOr<std::shared_ptr<SnapshotBuffer>> Create(const std::string& dir,
                                                          std::uint64_t capacity);
  ~SnapshotBuffer();
  SnapshotBuffer(const SnapshotBuffer&) = delete;
  SnapshotBuffer& operator=(const SnapshotBuffer&) = delete;

  int fd() const { return fd_; }
  std::uint64_t capacity() const { return capacity_; }  // payload bytes
  snapshot::BufferHeader& header() const { return *static_cast<snapshot::BufferHeader*>(base_); }
  const unsigned char* payload() const {
    return static_cast<const unsigned char*>(base_) + snapshot::kHeaderBytes;
  }

 private:
  SnapshotBuffer(int fd, void* base, std::uint64_t capacity)
      : fd_(fd), base_(base), capacity_(capacity) {}
  int fd_;
  void* base_;
  std::uint64_t capacity_;
};

// What a check found in one buffer. kSealed: complete and sealed, its checksum not checked
// again yet (Verify does).
enum class BufferVerdict { kNone, kIncomplete, kValid, kSealed, kCorrupt };
const char* Name(BufferVerdict v);

struct BufferCheck {
  BufferVerdict verdict = BufferVerdict::kNone;
  std::uint64_t capacity = 0;
  std::uint64_t step = 0, generation = 0;
  std::int64_t rank = -1;
};

class NodeSnapshots {
 public:
  explicit NodeSnapshots(SnapshotMemoryOptions options);
  ~NodeSnapshots();

  // Buffer `index` (0 or 1) of `local_rank`'s slot, with room for at least `bytes` of payload:
  // the one there when it is large enough, else a new one in its place (refused when the old
  // one holds the slot's newest complete snapshot, which a save never overwrites). The
  // refusal names the size and the limit (CheckRoom).
  StatusOr<std::shared_ptr<SnapshotBuffer>> Reserve(int local_rank, int index, std::uint64_t bytes);
  // The slot's buffers (null where none).
  std::array<std::shared_ptr<SnapshotBuffer>, 2> Slot(int local_rank) const;
  // Seals buffer `index` when it holds a complete snapshot that no checksum covers yet.
  void Seal(int local_rank, int index);
  // What a load needs: the newest complete buffer checked against its checksum, the other
  // one only sealed (kSealed: a load that picks it verifies it first). What is unsealed is
  // sealed.
  std::array<BufferCheck, 2> Check(int local_rank);
  // Buffer `index` checked against its checksum.
  BufferCheck Verify(int local_rank, int index);

  // Seals buffer `index` as Seal does, from a copy of it: its header and payload go into
  // `staged` first and the checksum is taken of the copy, so that the copy is known whole
  // (kValid) even when the worker starts its next save into the buffer meanwhile (then:
  // kIncomplete, and nothing is sealed). The staged header carries the checksum.
  BufferCheck Stage(int local_rank, int index, std::vector<unsigned char>* staged);
  // The step of buffer `index` when it holds a complete snapshot.
  std::optional<std::uint64_t> CompleteStep(int local_rank, int index) const;

  // Whether local rank `local_rank`'s slot holds a complete snapshot saved by rank `rank`.
  bool HoldsRank(int local_rank, std::int64_t rank) const;

  // Puts a sealed snapshot from elsewhere (a peer's copy, a file on disk) into the buffer of
  // `local_rank`'s slot that a save would write next, as the slot's newest, and checks it
  // against its checksum (kCorrupt: refused). `from` is its header; `read` writes its
  // from.payload_bytes of payload straight into the buffer (no copy staged on the way).
  // Returns the buffer's index.
  using PayloadReader = std::function<Status(unsigned char* dst, std::uint64_t n)>;
  StatusOr<int> Fill(int local_rank, const snapshot::BufferHeader& from, const PayloadReader& read);

  std::uint64_t allocated_bytes() const;
  // The newest step that every local rank with a slot holds complete; none when one holds none.
  std::optional<std::uint64_t> NodeStep() const;
  // Closes every buffer: the memory goes once no worker maps it.
  void Clear();

 private:
  BufferCheck CheckBuffer(const std::shared_ptr<SnapshotBuffer>& b, bool verify);

  SnapshotMemoryOptions options_;
  mutable std::mutex mu_;
  std::map<int, std::array<std::shared_ptr<SnapshotBuffer>, 2>> slots_;
};

}  // namespace crun::agent
