// Snapshots in the node's memory (docs/checkpoints.md): a worker saves its training state with
// a step number into shared memory that crun owns for the whole job, so that a restarted
// worker loads it back in milliseconds instead of reading a checkpoint from disk. A save is
// atomic and double-buffered (a worker killed mid-save leaves the previous snapshot whole);
// a load is collective over the job and returns the newest step that every rank holds.
//
//   auto store = crun::worker::SnapshotStore::Connect(ctx->env());
//   (*store)->Save(step, items);                 // every N steps
//   auto got = (*store)->Load(*ctx);             // after a (re)start: the step and the items
//
// The layout of the memory is crun/worker/snapshot_layout.h.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "crun/base/status.h"
#include "crun/worker/context.h"
#include "crun/worker/snapshot_layout.h"

namespace crun::worker {

// One thing to save: `bytes` of it, which `fill` writes to the destination it is given.
struct SnapshotItem {
  std::string name;
  std::string dtype;  // PyTorch's name ("float32"), or "bytes"
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;
  std::function<void(unsigned char* dst)> fill;
};

// A snapshot as loaded: its step and items; `data(i)` points into the node's memory and stays
// valid until this worker's next Save.
struct LoadedSnapshot {
  std::uint64_t step = 0;
  std::vector<snapshot::Item> items;
  std::vector<const unsigned char*> data;
  const snapshot::Item* Find(std::string_view name) const;
  const unsigned char* DataOf(std::string_view name) const;
};

// Which step a job resumes at: each rank's complete steps in, the newest that every rank
// holds out (none when there is none). Pure; SnapshotStore::Load runs it on rank 0.
std::optional<std::uint64_t> AgreeStep(const std::vector<std::vector<std::uint64_t>>& held);

class SnapshotStore {
 public:
  // Connects to crun's snapshot store for this worker's local rank; kNotFound when the worker
  // was not started by crun with one (CRUN_SNAPSHOT_SOCKET unset: --snapshots off).
  static StatusOr<std::unique_ptr<SnapshotStore>> Connect(const WorkerEnv& env);
  // Waits until crun has taken the last save (sealed it, and copied it for disk when it chose
  // it): a worker that saves and ends at once would otherwise end the job before crun read
  // that save, and its last step would not reach --checkpoint-dir.
  ~SnapshotStore();
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  // Saves `items` as step `step`; returns once the copy into memory is complete. crun sizes
  // the memory on the first save (and when the state grows) and refuses, naming the size and
  // the limit, when there is no room.
  Status Save(std::uint64_t step, const std::vector<SnapshotItem>& items,
              snapshot::Layout layout = snapshot::kSharded);

  // Collective: every rank of the job calls it. The newest step that every rank holds
  // complete, in its node's memory or on disk (crun's --checkpoint-dir, which crun then reads
  // back into memory), agreed through the job's store, with this rank's items; none when no
  // step is held by every rank. Refused (an error naming the rank and step) for a sharded snapshot
  // saved by another world size or rank, and for a snapshot whose checksum fails.
  StatusOr<std::optional<LoadedSnapshot>> Load(Context& context,
                                               Millis timeout = kDefaultStoreTimeout);

 private:
  struct Buffer;
  SnapshotStore(WorkerEnv env, int sock);
  StatusOr<std::string> Ask(const std::string& request, std::vector<int>* fds);
  StatusOr<std::array<std::string, 2>> TakeSlot(const std::string& verb);
  struct Held {
    std::vector<std::uint64_t> steps;
    std::string refusal;  // set only when nothing is held
  };
  Held HeldSteps(const std::array<std::string, 2>& verdict) const;
  StatusOr<std::optional<std::uint64_t>> Agree(Context& context, const Held& held, Millis timeout);
  StatusOr<LoadedSnapshot> Loaded(int index, const std::string& verdict);
  StatusOr<std::vector<std::uint64_t>> DiskSteps();
  StatusOr<LoadedSnapshot> Restore(std::uint64_t step);
  Status MapBuffer(int index, int fd, std::uint64_t capacity);

  WorkerEnv env_;
  int sock_;
  bool commit_ = false;  // CRUN_SNAPSHOT_COMMIT: a save waits for crun's seal and copy
  bool opened_ = false;
  int loads_ = 0;
  int unsettled_ = -1;  // the buffer of a save told with "saved" and not waited for since
  std::unique_ptr<Buffer> buffers_[2];
};

}  // namespace crun::worker
