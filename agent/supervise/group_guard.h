// GroupGuard: a helper process that outlives crun: it kills every registered process group
// when crun dies, even by SIGKILL, so no worker or grandchild survives its launcher; given the
// attempt's cgroup, it also ends everything in it and removes it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "agent/supervise/children.h"
#include "base/status.h"

namespace crun::agent {

class GroupGuard {
 public:
  // Starts the guard process. With `cgroup_dir`, the guard also ends every process in that
  // cgroup and removes it when crun goes (KillAndRemoveCgroup). The guard is owned in
  // `children` (which must outlive it) until it is reaped, when the GroupGuard goes.
  static StatusOr<std::unique_ptr<GroupGuard>> Start(ChildRegistry& children,
                                                     const std::string& cgroup_dir = "");
  ~GroupGuard();
  // The guard kills this group if crun dies before Forget().
  void Add(pid_t pgid);
  // The group is gone; its id may be reused by others.
  void Forget(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  GroupGuard(ChildRegistry& children, pid_t pid, int fd)
      : children_(children), pid_(pid), fd_(fd) {}
  void Send(std::int32_t message);
  ChildRegistry& children_;
  pid_t pid_;
  int fd_;
};

}  // namespace crun::agent
