// Checkpoint files that a crash at any instant cannot corrupt: a checkpoint is written to a
// temporary file in the same directory, flushed to disk, and renamed into place, so a reader
// sees either the whole file or none of it. Only one rank writes (rank 0, by convention);
// after a restart every rank reads the newest complete one. The directory must be visible to
// every rank that resumes from it (one node, or a shared file system).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "crun/base/status.h"

namespace crun::worker {

struct Checkpoint {
  std::uint64_t step = 0;
  std::string path;
};

class CheckpointDir {
 public:
  // Keeps the newest `keep` checkpoints (at least 1) and deletes older ones after each save.
  explicit CheckpointDir(std::string dir, int keep = 2);

  const std::string& dir() const { return dir_; }

  // Writes step `step` with `write`, which fills the stream (and may fail). Creates the
  // directory if needed. Errors name the file and the system's reason.
  Status Save(std::uint64_t step, const std::function<Status(std::ostream&)>& write);

  // The newest complete checkpoint, or none. Temporary files of interrupted saves are ignored.
  StatusOr<std::optional<Checkpoint>> Newest() const;

  // "step-000000001234.ckpt"
  static std::string FileName(std::uint64_t step);

 private:
  std::string dir_;
  int keep_;
};

}  // namespace crun::worker
