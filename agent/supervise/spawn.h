// Starting workers as processes (Linux): fork + exec, the child leading its own process group
// (so a signal reaches its children too) with SIGKILL as its parent-death signal, bound to its
// CPUs and memory nodes if asked, created into its cgroup where the kernel can. Where Yama
// restricts ptrace to ancestors, the child names crun as its tracer, so that the stack tools
// crun runs (py-spy, eu-stack: docs/hangs.md) may read it. An exec or binding failure comes back
// as a Status naming the program and errno; nothing is left running. Every child started here
// is owned (agent/supervise/children.h) until its owner reaps it. Watching it end is
// exit_watcher.h's; the guard that outlives crun is group_guard.h's.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "agent/supervise/children.h"
#include "agent/supervise/exit_status.h"
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
  ChildRegistry* children = nullptr;  // where it is owned
};

// Two phases, so that many children exec at the same time: StartProcess forks and returns at
// once; FinishStart waits for that child's exec and reports a failure (reaping the child).
// A child created into a cgroup that dies of SIGKILL before it runs a single instruction is
// started again with fork and a move into the cgroup, and clone3(CLONE_INTO_CGROUP) is not
// used again by this process: Linux 6.x kills every child cloned into a cgroup whose
// cgroup.kill was written once, when the cloning process's own cgroup was not killed the same
// number of times (docs/reliability.md, "The attempt's edge").
// The child is owned in `children` (children.h) from its fork.
StatusOr<PendingProcess> StartProcess(const ProcessSpec& spec, ChildRegistry& children);
StatusOr<pid_t> FinishStart(PendingProcess& pending);
// Both in one.
StatusOr<pid_t> SpawnProcess(const ProcessSpec& spec, ChildRegistry& children);
// Ends `pid`, a child owned in `children`, with SIGKILL to its process group and reaps it.
void KillAndReap(pid_t pid, ChildRegistry& children);

}  // namespace crun::agent
