// A cgroup (v2) that holds every worker of this crun and everything they start, where the
// machine lets crun make one: a descendant that leaves its process group and session (setsid,
// double fork) still cannot leave its cgroup, so the attempt's end, crun's exit and, if crun
// is SIGKILLed, its guard process end all of them. Where no cgroup can be made (no cgroup2
// mount, no write access, a systemd unit that did not delegate, CRUN_CGROUP=0), crun says so
// at info level
// and relies on being the subreaper of its orphans, which covers every end but its own
// SIGKILL (docs/cli.md, "Differences from torchrun").
#pragma once

#include <memory>
#include <string>

namespace crun::agent {

class WorkerCgroup {
 public:
  // A new cgroup below this process's own in the cgroup2 hierarchy (under `root`, "" for the
  // real /proc and /sys); nullptr, with the reason in `why_not`, when none can be made.
  static std::unique_ptr<WorkerCgroup> Create(std::string* why_not);
  ~WorkerCgroup();  // KillAll, then removes the directory (once it is empty)

  // The directory, and a descriptor of it for clone3(CLONE_INTO_CGROUP) (ProcessSpec).
  const std::string& dir() const { return dir_; }
  int fd() const { return fd_; }
  // SIGKILL to every process in it (cgroup.kill, else one by one from cgroup.procs). Returns
  // how many processes it held.
  int KillAll() const;

 private:
  WorkerCgroup(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  std::string dir_;
  int fd_;
};

// Ends every process in the cgroup at `dir` and removes it: what WorkerCgroup's destructor
// does, for the guard process (async-signal-safe work is not needed there: the guard is a
// fresh process of its own).
void KillAndRemoveCgroup(const std::string& dir);

}  // namespace crun::agent
