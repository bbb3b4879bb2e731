// This process's children, and which of them are its own. Every child crun starts here
// (StartProcess, a warm worker it adopts, the GroupGuard) is owned until its owner reaps it.
// Any other child is an orphan of a worker that came to crun as its subreaper: those are crun's
// to reap and to end (AttemptEdge), never an owned one behind its ExitWatcher's back.
#pragma once

#include <sys/types.h>

#include <mutex>
#include <set>
#include <vector>

#include "base/status.h"

namespace crun::agent {

// The owned children of this process. The kernel keeps one list of children per process, so a
// process that starts children has one registry, made by whoever starts them (the agent's
// worker group) and passed to every part that forks or reaps: with two, each would take the
// other's children for orphans. A mutex, though the agent is single-threaded: the stack tools
// and the guard are started from the same process.
class ChildRegistry {
 public:
  ChildRegistry() = default;
  ChildRegistry(const ChildRegistry&) = delete;
  ChildRegistry& operator=(const ChildRegistry&) = delete;

  // `pid` is a child this process started itself (or adopted: a warm worker reparented to it),
  // reaped from here on by its owner (FinishStart, an ExitWatcher), never as an orphan.
  void Own(pid_t pid);
  // waitpid for an owned child (EINTR retried), which is then no longer owned.
  pid_t Reap(pid_t pid, int* status, int flags);
  // Whether `pid` is a child this process started itself and has not reaped yet.
  bool Owns(pid_t pid) const;
  // The children that are not owned: orphans of workers, reparented to this subreaper.
  std::vector<pid_t> Orphans() const;
  // Reaps every orphan child that has ended (never an owned one); returns how many.
  int ReapOrphans();

 private:
  mutable std::mutex mutex_;
  std::set<pid_t> owned_;
};

// The children of this process (every thread's, zombies too), from /proc/self/task/*/children.
std::vector<pid_t> ChildrenOfSelf();

// Makes this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER): a
// worker's grandchild that daemonises (setsid + double fork) becomes crun's child instead of
// init's, so crun can find it, reap it as it ends, and end it with its attempt (AttemptEdge).
Status BecomeSubreaper();

}  // namespace crun::agent
