// Collectives through shared memory, for a group whose ranks all run on one host: what NCCL
// does inside a node, for CPU buffers. Each rank owns a slot in one mapped segment; a
// collective is a few rounds of "copy into my slot, arrive, wait for everyone, read the
// others' slots". Waiting spins briefly (a peer usually arrives within microseconds) and then
// sleeps on a futex, so an idle rank costs no CPU. Against Gloo's loopback TCP this saves the
// kernel copies and the I/O thread's wake-ups that dominate small collectives.
//
// Failure is never silent: a peer that exits (its pid is gone), leaves (its group is
// destroyed), breaks the group (an error or Abort) or does not arrive by the deadline makes
// every waiting rank return an error naming it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "crun/worker/process_group.h"
#include "rendezvous/store/store.h"

namespace crun::worker {

class ShmChannel {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  // What Connect decided, the same on every rank: a channel, or why the ranks go without.
  struct Connection {
    std::unique_ptr<ShmChannel> channel;
    std::string why_not;  // when channel is null
  };
  // Collective over the group's store keys under `key_prefix`: rank 0 creates the segment and
  // offers it, the others attach and answer. No channel when the ranks do not share memory
  // (other hosts, other pid or mount namespaces, no room in /dev/shm) or one of them is not
  // `willing`. An error only when the store fails.
  static StatusOr<Connection> Connect(Store& store, const std::string& key_prefix, int rank,
                                      int size, bool willing, Millis timeout);
  // Tells the peers this rank is gone: any collective they wait on for it fails at once.
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // The same operations as ProcessGroup's, on one thread at a time. Errors are details; the
  // caller prefixes the group and operation. A failed operation leaves the channel broken.
  Status AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op, Deadline deadline);
  Status ReduceScatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                       Deadline deadline);
  Status AllGather(const void* in, void* out, std::size_t bytes, Deadline deadline);
  Status Broadcast(void* data, std::size_t bytes, int root, Deadline deadline);
  Status Barrier(Deadline deadline);

  // Breaks the channel from any thread: this rank's and every peer's waits fail at once.
  void Break();

  struct Segment;  // the mapped layout (shm_channel.cc)

 private:
  ShmChannel(Segment* segment, std::size_t mapped_bytes, int rank, int size);
  void Arrive();
  Status WaitAll(Deadline deadline);
  std::uint8_t* Slot(int rank) const;
  Status Failure(std::uint32_t broken, int missing) const;

  Segment* seg_;
  std::size_t mapped_bytes_;
  std::size_t slot_bytes_;
  int rank_;
  int size_;
  std::uint64_t epoch_ = 0;   // arrivals so far; every rank counts the same
  std::uint64_t chunks_ = 0;  // chunks so far: picks the set of slots (shm_channel.cc)
};

}  // namespace crun::worker
