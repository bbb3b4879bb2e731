// POSIX process supervision for workers (Linux).
//
// * SpawnProcess: fork + exec, the child leading its own process group (so a signal reaches
//   its children too) with SIGKILL as its parent-death signal, bound to its CPUs and memory
//   nodes if asked. Where Yama restricts ptrace to ancestors, the child names crun as its
//   tracer, so that the stack tools crun runs (py-spy, eu-stack: docs/hangs.md) may read it. An
//   exec or binding failure comes back as a Status naming the program and errno; nothing is left
//   running.
// * ExitWatcher: calls back on the event loop the moment a process exits (pidfd readiness, no
//   polling) and reaps it.
// * GroupGuard: a helper process that outlives crun: it kills every registered process group
//   when crun dies, even by SIGKILL, so no worker or grandchild survives its launcher.
// * Owned children: every child this process starts here (StartProcess, GroupGuard) is owned
//   until it is reaped by its owner. Any other child is an orphan of a worker that came to crun
//   as its subreaper (OwnedChildren, ReapOrphans): those are crun's to reap and to end, never
//   an owned one behind its ExitWatcher's back.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "base/signals.h"  // SignalName, ParseSignal, DescribeExit
#include "base/status.h"

namespace crun::agent {

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is looked up on PATH when it has no '/'
  std::vector<std::string> envp;  // "KEY=VALUE"
  int stdout_fd = -1;             // -1: inherit crun's
  int stderr_fd = -1;
  // --numa-binding: the CPUs the child may run on and the NUMA nodes its memory comes from
  // (MPOL_BIND), set before exec. Empty: crun's own.
  std::vector<int> cpus;
  std::vector<int> mem_nodes;
  // A cgroup directory (WorkerCgroup) the child starts in: created straight into it with
  // clone3(CLONE_INTO_CGROUP) where the kernel has it (no migration, which costs milliseconds),
  // else moved there before exec. -1: none.
  int cgroup_fd = -1;
  std::string cgroup_dir;  // for messages and the fallback
  // Descriptors the program keeps across exec, at the same numbers (a heartbeat pipe the
  // environment names); every other descriptor of crun's is close-on-exec.
  std::vector<int> inherit_fds;
};

struct ExitStatus {
  bool signaled = false;
  int value = 0;  // exit code, or signal number when signaled

  bool success() const { return !signaled && value == 0; }
  // The shell's convention: the exit code, or 128 + signal.
  int ShellCode() const { return signaled ? 128 + value : value; }
  // "exit code 3", "signal 9 (SIGKILL)" (DescribeExit)
  std::string Describe() const;
};

// A started child whose exec has not been confirmed yet.
struct PendingProcess {
  pid_t pid = -1;
  // The child writes one byte as soon as it runs, then nothing (it exec'd: EOF) or the stage
  // and errno of what failed. No byte at all: it was killed before it ran (below).
  int report_fd = -1;
  ProcessSpec spec;        // for messages, and to start it again without CLONE_INTO_CGROUP
  bool in_cgroup = false;  // created straight into spec.cgroup_fd
  // Forked from a warm template (agent/warm): `report_fd` is the write end of the pipe it
  // waits on, and FinishStart tells it to run.
  bool warm = false;
};

// Two phases, so that many children exec at the same time: StartProcess forks and returns at
// once; FinishStart waits for that child's exec and reports a failure (reaping the child).
// A child created into a cgroup that dies of SIGKILL before it runs a single instruction is
// started again with fork and a move into the cgroup, and clone3(CLONE_INTO_CGROUP) is not
// used again by this process: Linux 6.x kills every child cloned into a cgroup whose
// cgroup.kill was written once, when the cloning process's own cgroup was not killed the same
// number of times (docs/reliability.md, "The attempt's edge").
StatusOr<PendingProcess> StartProcess(const ProcessSpec& spec);
StatusOr<pid_t> FinishStart(PendingProcess& pending);
// Both in one.
StatusOr<pid_t> SpawnProcess(const ProcessSpec& spec);
// Takes `pid`, a child this process did not fork itself (a warm worker, reparented to it), as
// owned: from here on it is reaped by its owner (FinishStart, an ExitWatcher), never as an
// orphan.
void AdoptChild(pid_t pid);
// Ends `pid`, an owned child, with SIGKILL to its process group and reaps it.
void KillAndReap(pid_t pid);

class ExitWatcher {
 public:
  using Callback = std::function<void(ExitStatus)>;
  // Watches `pid` (a child of this process). The callback runs once, on `io`'s thread.
  static StatusOr<std::unique_ptr<ExitWatcher>> Watch(boost::asio::io_context& io, pid_t pid,
                                                      Callback on_exit);
  virtual ~ExitWatcher() = default;
};

// The children of this process (every thread's, zombies too), from /proc/self/task/*/children.
std::vector<pid_t> ChildrenOfSelf();

// Whether `pid` is a child this process started itself and has not reaped yet.
bool IsOwnedChild(pid_t pid);
// The children that are not owned: orphans of workers, reparented to this subreaper.
std::vector<pid_t> OrphanChildren();
// Reaps every orphan child that has ended (never an owned one); returns how many.
int ReapOrphans();

// Makes this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER): a
// worker's grandchild that daemonises (setsid + double fork) becomes crun's child instead of
// init's, so crun can find it, reap it as it ends, and end it with its attempt (AttemptEdge).
Status BecomeSubreaper();

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
