// Snapshots persisted off the training path (docs/checkpoints.md, "On disk"): with
// --checkpoint-dir, crun copies a snapshot out of the node's memory when it seals it and writes
// the copy to disk on a thread of its own, so a save returns as soon as the memory copy is
// done. One file a rank and step, DIR/step-<step>/rank-<rank>.snap: the buffer's header and
// payload as they are in memory (crun/worker/snapshot_layout.h), checksum included, written
// to a temporary name, flushed and renamed, so a file under its final name is always whole.
// Each rank keeps its newest `keep` steps that every rank of the job holds on disk (the job's
// step, below), and the few steps above it that other nodes' writers have not reached yet.
//
// Which steps: every rank must hold the step a job resumes at, and nodes do not talk to each
// other about disk writes. So the choice depends only on the steps saved, which every rank
// saves alike: a snapshot is written when its step is the first one saved at or past the next
// multiple of `every` (with every=100 and saves every 7 steps: 105, 203, 301, ...).
//
// Which steps stay: a node whose writer lags behind another's must not find that the other
// already dropped the steps it holds, or no step is left that every rank holds. Every rank
// writes the same steps in order, so the newest step that every rank has on disk (the job's
// step) is the oldest of the nodes' newest: each node publishes its own in the round's store
// ("crun/disk/<group rank>") after a write and reads the others'. A crun that runs the whole
// job needs no store; where the store cannot be reached, the last job's step seen stands.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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

// The round as the writer sees it: this node's ranks and the round's store, through which
// nodes tell each other the newest step they hold on disk. No ranks: no round (the steps of
// the rank written are all that count).
struct DiskRound {
  int group_rank = 0;
  int nodes = 1;
  std::int64_t base_rank = 0;  // RANK of local rank 0
  int local_ranks = 0;
  std::string store_host;  // empty: no store to ask (between attempts)
  std::uint16_t store_port = 0;
};

// Steps above the job's step that a rank keeps besides `keep` (docs/checkpoints.md, "Kept"): a
// writer lags by at most three chosen steps (one being written, two waiting), and one more.
inline constexpr int kStepsAhead = 4;

// Which of one rank's steps on disk (`steps`, newest first) go: of the steps at or below
// `job_step`, all but the newest `keep`; of those above it (all of them when it is not known),
// all but the newest `keep + kStepsAhead`.
std::vector<std::uint64_t> StepsToDrop(const std::vector<std::uint64_t>& steps,
                                       std::optional<std::uint64_t> job_step, int keep);

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

  // A new round (BeforeStart), or none (`DiskRound{}` once an attempt ends: its store goes).
  void NewRound(DiskRound round);

  // Writes a staged snapshot (header and payload, as Stage copied them) under its rank and
  // step, atomically, then drops the rank's steps that StepsToDrop names.
  Status Write(const std::vector<unsigned char>& staged);

  // The newest step that every rank of the job holds on disk, as far as this node knows.
  std::optional<std::uint64_t> JobStep(std::int64_t written_rank);

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
  // `seen`, if newer, becomes the job's step remembered; returns the one remembered.
  std::optional<std::uint64_t> Remembered(std::optional<std::uint64_t> seen);

  SnapshotDiskOptions options_;
  std::string claim_;  // DIR/.crun-<host>-<pid>, locked while this crun lives
  int claim_fd_ = -1;
  mutable std::mutex mu_;
  std::map<int, std::uint64_t> chosen_;  // local rank -> last chosen step
  DiskRound round_;
  std::optional<std::uint64_t> job_step_;  // the newest seen, kept across rounds
  DiskCounters counters_;
};

}  // namespace crun::agent
