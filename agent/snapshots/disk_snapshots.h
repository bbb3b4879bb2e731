// Snapshots persisted off the training path (docs/checkpoints.md, "On disk"): with
// --checkpoint-dir, crun copies a snapshot out of the node's memory when it seals it and writes
// the copy to disk on a thread of its own, so a save returns as soon as the memory copy is
// done. One file a rank and step, DIR/step-<step>/rank-<rank>.snap: the buffer's header and
// payload as they are in memory (crun/worker/snapshot_layout.h), checksum included, written
// to a temporary name, flushed and renamed, so a file under its final name is always whole.
// The newest `keep` steps of each rank stay; older ones go.
//
// Which steps: every rank must hold the step a job resumes at, and nodes do not talk to each
// other about disk writes. So the choice depends only on the steps saved, which every rank
// saves alike: a snapshot is written when its step is the first one saved at or past the next
// multiple of `every` (with every=100 and saves every 7 steps: 105, 203, 301, ...).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/snapshots/node_snapshots.h"
#include "agent/snapshots/snapshot_options.h"
#include "base/status.h"

namespace crun::agent {

// What the writer has done, for the metrics and the log.
struct DiskCounters {
  std::uint64_t written = 0, bytes = 0, skipped = 0, failed = 0, restored = 0;
  std::uint64_t last_step = 0;
};

// DIR/step-<step, 12 digits>/rank-<rank, 5 digits>.snap
std::string SnapshotFilePath(const std::string& dir, std::uint64_t step, std::int64_t rank);

// Whether `step` is the first at or past the next multiple of `every` since `last` (the step
// last chosen for this rank; none: the first save of this crun is chosen).
bool ChoosesStep(std::uint64_t step, std::uint64_t every, const std::uint64_t* last);

class DiskSnapshots {
 public:
  explicit DiskSnapshots(SnapshotDiskOptions options);
  ~DiskSnapshots();
  DiskSnapshots(const DiskSnapshots&) = delete;
  DiskSnapshots& operator=(const DiskSnapshots&) = delete;

  // Creates the directory (and its parents), checks that crun can write there and claims it
  // for this job: a directory that a live crun of another job claims is refused, naming its
  // host, pid and job. Before any worker runs.
  Status Prepare();

  const SnapshotDiskOptions& options() const { return options_; }

  // Whether the snapshot of `local_rank` at `step` is one to write (ChoosesStep); remembers it.
  bool Choose(int local_rank, std::uint64_t step);

  // Writes a staged snapshot (header and payload, as Stage copied them) under its rank and
  // step, atomically, then drops the rank's steps beyond `keep`.
  Status Write(const std::vector<unsigned char>& staged);

  // The steps on disk for `rank` whose snapshots that rank may load in a world of
  // `world_size` (its own, or any replicated one), newest first; none when resume is off.
  std::vector<std::uint64_t> Steps(std::int64_t rank, std::int64_t world_size) const;

  // Reads rank `rank`'s snapshot at `step` into memory: into the buffer of `local_rank`'s slot
  // that a save would write next, checked against its checksum. Returns the buffer's index.
  StatusOr<int> Restore(NodeSnapshots& memory, int local_rank, std::int64_t rank,
                        std::uint64_t step);

  DiskCounters counters() const;
  // A snapshot not written because a newer one was waiting (skipped), or because writing it
  // failed (failed).
  void CountSkipped();
  void CountFailed();

 private:
  Status Claim();

  SnapshotDiskOptions options_;
  std::string claim_;  // DIR/.crun-<host>-<pid>, locked while this crun lives
  int claim_fd_ = -1;
  mutable std::mutex mu_;
  std::map<int, std::uint64_t> chosen_;  // local rank -> last chosen step
  DiskCounters counters_;
};

}  // namespace crun::agent
