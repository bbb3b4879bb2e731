// GroupGuard: a helper process that outlives crun: it kills every registered process group
// when crun dies, even by SIGKILL, so no worker or grandchild survives its launcher; given the
// attempt's cgroup, it also ends everything in it and removes it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace crun::agent {

class GroupGuard {
 public:
  // Starts the guard process. With `cgroup_dir`, the guard also ends every process in that
  // cgroup and removes it when crun goes (KillAndRemoveCgroup).
  static StatusOr<std::unique_ptr<GroupGuard>> Start(const std::string& cgroup_dir = "");
  ~GroupGuard();
  // The guard kills this group if crun dies before Forget().
  void Add(pid_t pgid);
  // The group is gone; its id may be reused by others.
  void Forget(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  GroupGuard(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  void Send(std::int32_t message);
  pid_t pid_;
  int fd_;
};

}  // namespace crun::agent
