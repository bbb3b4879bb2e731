#include "agent/supervise/spawn.h"

#include "agent/supervise/children.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace crun::agent {
namespace {

// clone3's arguments (linux/sched.h; spelled out here, as that header clashes with glibc's).
struct CloneArgs {
  std::uint64_t flags = 0, pidfd = 0, child_tid = 0, parent_tid = 0, exit_signal = 0, stack = 0,
                stack_size = 0, tls = 0, set_tid = 0, set_tid_size = 0, cgroup = 0;
};
constexpr std::uint64_t kCloneIntoCgroup = 0x200000000ULL;
std::atomic<bool> clone_into_cgroup_works{true};

// fork(), but created inside the cgroup `cgroup_fd` when that is given and the kernel can
// (Linux 5.7+): `*in_cgroup` says whether it was. Returns as fork() does. The child of a raw
// clone3 runs no atfork handlers: like fork's child here, it only prepares and execs.
pid_t ForkInto(int cgroup_fd, bool* in_cgroup) {
  *in_cgroup = false;
  if (cgroup_fd >= 0 && clone_into_cgroup_works.load()) {
    CloneArgs args;
    args.flags = kCloneIntoCgroup;
    args.exit_signal = SIGCHLD;
    args.cgroup = static_cast<std::uint64_t>(cgroup_fd);
    const long pid = ::syscall(SYS_clone3, &args, sizeof args);
    if (pid >= 0) {
      *in_cgroup = true;
      return static_cast<pid_t>(pid);
    }
    clone_into_cgroup_works = false;  // an older kernel, or a cgroup it refuses: plain fork
  }
  return ::fork();
}

// Restores what a fresh program expects: no blocked signals, default dispositions.
void ResetSignalsInChild() {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL);
  }
}

// Forks the child of `spec` (into its cgroup when `into_cgroup` and the kernel can), which
// writes one byte to the report pipe as soon as it runs, then execs.
StatusOr<PendingProcess> Fork(const ProcessSpec& spec, bool into_cgroup, ChildRegistry& children) {
  if (spec.argv.empty()) return InvalidArgument("no program to start");
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.envp) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : spec.cpus) {
    if (c < 0 || c >= CPU_SETSIZE)
      return InvalidArgument("CPU " + std::to_string(c) + " is out of range");
    CPU_SET(c, &cpus);
  }
  // set_mempolicy's node mask: one bit per node, in unsigned longs.
  constexpr int kMaxNodes = 1024;
  constexpr int kBits = 8 * sizeof(unsigned long);
  std::array<unsigned long, kMaxNodes / kBits> nodes{};
  for (int n : spec.mem_nodes) {
    if (n < 0 || n >= kMaxNodes)
      return InvalidArgument("NUMA node " + std::to_string(n) + " is out of range");
    nodes[static_cast<std::size_t>(n / kBits)] |= 1UL << (n % kBits);
  }
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return PosixError("pipe", errno);
  const pid_t parent = ::getpid();
  const std::string procs = spec.cgroup_dir + "/cgroup.procs";
  bool in_cgroup = false;  // the child was created inside spec's cgroup
  const pid_t pid = ForkInto(into_cgroup ? spec.cgroup_fd : -1, &in_cgroup);
  if (pid < 0) {
    const int err = errno;
    ::close(report[0]);
    ::close(report[1]);
    return PosixError("fork for '" + spec.argv[0] + "'", err);
  }
  if (pid == 0) {
    ::close(report[0]);
    const char ran = 'r';
    if (::write(report[1], &ran, 1) != 1) ::_exit(127);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // crun died before the line above
    ResetSignalsInChild();
    if (spec.stdout_fd >= 0) ::dup2(spec.stdout_fd, STDOUT_FILENO);
    if (spec.stderr_fd >= 0) ::dup2(spec.stderr_fd, STDERR_FILENO);
    for (int fd : spec.inherit_fds) ::fcntl(fd, F_SETFD, 0);
    // Yama (ptrace_scope 1) lets only ancestors trace; crun and what it runs may (EINVAL
    // without Yama: nothing to do).
    ::prctl(PR_SET_PTRACER, parent);
    // What failed, and its errno, for FinishStart.
    auto fail = [&](int stage) {
      const int what[2] = {stage, errno};
      ssize_t ignored = ::write(report[1], what, sizeof what);
      (void)ignored;
      ::_exit(127);
    };
    if (spec.cgroup_fd >= 0 && !in_cgroup) {
      const int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0 || ::write(fd, "0", 1) != 1) fail(3);
      ::close(fd);
    }
    if (!spec.cpus.empty() && ::sched_setaffinity(0, sizeof cpus, &cpus) != 0) fail(1);
    if (!spec.mem_nodes.empty() &&
        ::syscall(SYS_set_mempolicy, 2 /* MPOL_BIND */, nodes.data(), kMaxNodes + 1) != 0) {
      fail(2);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    fail(0);
  }
  children.Own(pid);
  ::setpgid(pid, pid);  // also here, so the group exists whichever side runs first
  ::close(report[1]);
  return PendingProcess{pid, report[0], spec, in_cgroup, false, &children};
}

// Reads up to `size` bytes of the report, to its EOF.
ssize_t ReadReport(int fd, char* buffer, std::size_t size) {
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, buffer + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  return static_cast<ssize_t>(got);
}

std::string List(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

}  // namespace

StatusOr<PendingProcess> StartProcess(const ProcessSpec& spec, ChildRegistry& children) {
  return Fork(spec, clone_into_cgroup_works.load(), children);
}

// A warm worker waits for one byte on its pipe: this one makes it run.
static StatusOr<pid_t> FinishWarmStart(PendingProcess& pending) {
  const char go = 'g';
  ssize_t n;
  do {
    n = ::write(pending.report_fd, &go, 1);
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  ::close(pending.report_fd);
  pending.report_fd = -1;
  if (n == 1) return pending.pid;
  KillAndReap(pending.pid, *pending.children);
  return PosixError("the warm worker process for '" + pending.spec.argv[0] + "' (pid " +
                        std::to_string(pending.pid) + ") ended before it ran",
                    err);
}

StatusOr<pid_t> FinishStart(PendingProcess& pending) {
  if (pending.warm) return FinishWarmStart(pending);
  char report[1 + 2 * sizeof(int)] = {};  // the byte it ran, then stage and errno
  const ssize_t n = ReadReport(pending.report_fd, report, sizeof report);
  ::close(pending.report_fd);
  pending.report_fd = -1;
  if (n == 1) return pending.pid;  // it ran, and exec closed the pipe
  int status = 0;
  pending.children->Reap(pending.pid, &status, 0);
  const std::string& program = pending.spec.argv[0];
  if (n == 0) {
    // Killed before it ran: created into a cgroup the kernel kills every new child of.
    if (pending.in_cgroup && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      clone_into_cgroup_works = false;
      auto again = Fork(pending.spec, false, *pending.children);
      if (!again.ok()) return again.status();
      return FinishStart(*again);
    }
    return Aborted("'" + program + "' ended before it ran (" +
                   (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                        : "exit " + std::to_string(WEXITSTATUS(status))) +
                   ")");
  }
  int what[2] = {0, 0};  // stage, errno
  std::memcpy(what, report + 1, sizeof what);
  if (what[0] == 1) {
    return PosixError("cannot bind '" + program + "' to CPUs " + List(pending.spec.cpus), what[1]);
  }
  if (what[0] == 2) {
    return PosixError("cannot bind the memory of '" + program + "' to NUMA nodes " +
                          List(pending.spec.mem_nodes),
                      what[1]);
  }
  if (what[0] == 3) {
    return PosixError("cannot move '" + program + "' into the cgroup " + pending.spec.cgroup_dir,
                      what[1]);
  }
  return PosixError("cannot start '" + program + "'", what[1]);
}

void KillAndReap(pid_t pid, ChildRegistry& children) {
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  int status = 0;
  children.Reap(pid, &status, 0);
}

StatusOr<pid_t> SpawnProcess(const ProcessSpec& spec, ChildRegistry& children) {
  auto pending = StartProcess(spec, children);
  if (!pending.ok()) return pending.status();
  return FinishStart(*pending);
}

}  // namespace crun::agent
