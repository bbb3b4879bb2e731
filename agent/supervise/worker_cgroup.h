// A cgroup (v2) that holds every worker of this crun and everything they start, where the
// machine lets crun make one: a descendant that leaves its process group and session (setsid,
// double fork) still cannot leave its cgroup, so the attempt's end, crun's exit and, if crun
// is SIGKILLed, its guard process end all of them. Each attempt has a cgroup of its own below
// it (AttemptCgroup): killed, seen empty and removed before the next attempt starts, so that
// nothing that ends one attempt can reach the next (docs/reliability.md, "The attempt's edge").
// Where no cgroup can be made (no cgroup2 mount, no write access, a systemd unit that did not
// delegate, CRUN_CGROUP=0), crun says so at info level and relies on being the subreaper of its
// orphans, which covers every end but its own SIGKILL (docs/cli.md, "Differences from torchrun").
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace crun::agent {

class WorkerCgroup {
 public:
  // A new cgroup below this process's own in the cgroup2 hierarchy, or why none can be made
  // (kUnavailable: CRUN_CGROUP=0, no cgroup2, or a directory that cannot be created).
  static StatusOr<std::unique_ptr<WorkerCgroup>> Create();
  ~WorkerCgroup();  // KillAndRemoveCgroup; a warning names what it could not remove

  const std::string& dir() const { return dir_; }

 private:
  explicit WorkerCgroup(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;  // nothing is started in it: each attempt has its own (AttemptCgroup)
};

// One attempt's cgroup, <worker cgroup>/attempt-<n>: the workers are created into it, and it
// is never used again once killed (a new attempt gets a new one).
class AttemptCgroup {
 public:
  // Creates it; an error names the directory and errno.
  static StatusOr<std::unique_ptr<AttemptCgroup>> Create(const WorkerCgroup& parent, int attempt);
  // <worker cgroup>/<name>, for what lives beside the attempts (the warm template).
  static StatusOr<std::unique_ptr<AttemptCgroup>> Create(const WorkerCgroup& parent,
                                                         const std::string& name);
  ~AttemptCgroup();  // removes the directory if it is empty (Remove), leaves it otherwise

  // The directory, and a descriptor of it for clone3(CLONE_INTO_CGROUP) (ProcessSpec).
  const std::string& dir() const { return dir_; }
  int fd() const { return fd_; }
  // SIGKILL to every process in it (cgroup.kill, else one by one from cgroup.procs).
  void KillAll() const;
  // Whether any process is in it ("populated 1" in cgroup.events; cgroup.procs without it).
  bool Populated() const;
  std::vector<pid_t> Procs() const;
  // rmdir: succeeds once nothing is in it.
  Status Remove();

 private:
  AttemptCgroup(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  std::string dir_;
  int fd_;
  bool removed_ = false;
};

// This process's own cgroup2 directory (under the mount point); "" without cgroup2.
std::string OwnCgroupDir();

// How long KillAndRemoveCgroup waits for killed processes to leave.
inline constexpr std::chrono::seconds kCgroupRemoveDeadline{5};

// Ends every process in the cgroup at `dir` and in every cgroup below it (the attempts', the
// warm template's, any a worker made), and removes them all, deepest first: whether `dir` is
// gone by kCgroupRemoveDeadline. What WorkerCgroup's destructor does, and the guard process
// (async-signal-safe work is not needed there: the guard is a fresh process of its own).
bool KillAndRemoveCgroup(const std::string& dir);

}  // namespace crun::agent
