#include "agent/supervise/process.h"

#include "agent/supervise/worker_cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>

#include <boost/asio/posix/stream_descriptor.hpp>

#include "base/signals.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;

// clone3's arguments (linux/sched.h; spelled out here, as that header clashes with glibc's).
struct CloneArgs {
  std::uint64_t flags = 0, pidfd = 0, child_tid = 0, parent_tid = 0, exit_signal = 0, stack = 0,
                stack_size = 0, tls = 0, set_tid = 0, set_tid_size = 0, cgroup = 0;
};
constexpr std::uint64_t kCloneIntoCgroup = 0x200000000ULL;
std::atomic<bool> clone_into_cgroup_works{true};

// The children started here and not reaped yet (OwnedChildren). A mutex, though the agent is
// single-threaded: the stack tools and the guard are started from the same process.
std::mutex owned_mutex;
std::set<pid_t> owned;

void Own(pid_t pid) {
  std::lock_guard<std::mutex> lock(owned_mutex);
  owned.insert(pid);
}
void Disown(pid_t pid) {
  std::lock_guard<std::mutex> lock(owned_mutex);
  owned.erase(pid);
}

// waitpid for an owned child, which is then no longer owned.
pid_t ReapOwned(pid_t pid, int* status, int flags) {
  pid_t r;
  do {
    r = ::waitpid(pid, status, flags);
  } while (r < 0 && errno == EINTR);
  if (r == pid) Disown(pid);
  return r;
}

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

class PidfdWatcher final : public ExitWatcher {
 public:
  PidfdWatcher(asio::io_context& io, pid_t pid, int pidfd, Callback cb)
      : pid_(pid), fd_(io, pidfd), callback_(std::move(cb)) {
    Wait();
  }
  ~PidfdWatcher() override {
    boost::system::error_code ec;
    fd_.close(ec);
  }

 private:
  void Wait() {
    fd_.async_wait(asio::posix::stream_descriptor::wait_read,
                   [this](const boost::system::error_code& ec) {
                     if (ec) return;  // cancelled: the watcher is being destroyed
                     Reap();
                   });
  }

  // Readiness is a hint, never proof: the reactor can report a descriptor ready that is not
  // (an event of a closed pidfd whose slot the reactor gave to this one, at a restart). A
  // blocking wait there stopped crun's event loop for good, its store and signals with it.
  // So the child is reaped only if it has ended, and otherwise watched again.
  void Reap() {
    int status = 0;
    const pid_t r = ReapOwned(pid_, &status, WNOHANG);
    if (r == 0) return Wait();
    ExitStatus exit;
    if (r == pid_ && WIFSIGNALED(status)) {
      exit.signaled = true;
      exit.value = WTERMSIG(status);
    } else if (r == pid_) {
      exit.value = WEXITSTATUS(status);
    } else {
      exit.value = 255;  // reaped elsewhere; should not happen for our own children
    }
    auto cb = std::move(callback_);
    cb(exit);  // may destroy this watcher: nothing touches members after this line
  }

  pid_t pid_;
  asio::posix::stream_descriptor fd_;
  Callback callback_;
};

}  // namespace

std::string ExitStatus::Describe() const { return DescribeExit(signaled, value); }

namespace {

// Forks the child of `spec` (into its cgroup when `into_cgroup` and the kernel can), which
// writes one byte to the report pipe as soon as it runs, then execs.
StatusOr<PendingProcess> Fork(const ProcessSpec& spec, bool into_cgroup) {
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
  Own(pid);
  ::setpgid(pid, pid);  // also here, so the group exists whichever side runs first
  ::close(report[1]);
  return PendingProcess{pid, report[0], spec, in_cgroup};
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

StatusOr<PendingProcess> StartProcess(const ProcessSpec& spec) {
  return Fork(spec, clone_into_cgroup_works.load());
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
  KillAndReap(pending.pid);
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
  ReapOwned(pending.pid, &status, 0);
  const std::string& program = pending.spec.argv[0];
  if (n == 0) {
    // Killed before it ran: created into a cgroup the kernel kills every new child of.
    if (pending.in_cgroup && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      clone_into_cgroup_works = false;
      auto again = Fork(pending.spec, false);
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

void AdoptChild(pid_t pid) { Own(pid); }

void KillAndReap(pid_t pid) {
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  int status = 0;
  ReapOwned(pid, &status, 0);
}

StatusOr<pid_t> SpawnProcess(const ProcessSpec& spec) {
  auto pending = StartProcess(spec);
  if (!pending.ok()) return pending.status();
  return FinishStart(*pending);
}

std::vector<pid_t> ChildrenOfSelf() {
  std::vector<pid_t> out;
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return out;
  while (const dirent* t = ::readdir(tasks)) {
    if (t->d_name[0] == '.') continue;
    std::ifstream in(std::string("/proc/self/task/") + t->d_name + "/children");
    pid_t pid;
    while (in >> pid) out.push_back(pid);
  }
  ::closedir(tasks);
  return out;
}

Status BecomeSubreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return PosixError("PR_SET_CHILD_SUBREAPER", errno);
  return Status::Ok();
}

bool IsOwnedChild(pid_t pid) {
  std::lock_guard<std::mutex> lock(owned_mutex);
  return owned.count(pid) > 0;
}

std::vector<pid_t> OrphanChildren() {
  std::vector<pid_t> orphans;
  for (pid_t c : ChildrenOfSelf()) {
    if (!IsOwnedChild(c)) orphans.push_back(c);
  }
  return orphans;
}

int ReapOrphans() {
  int reaped = 0;
  for (pid_t c : OrphanChildren()) {
    int status = 0;
    if (::waitpid(c, &status, WNOHANG) == c) ++reaped;
  }
  return reaped;
}

StatusOr<std::unique_ptr<ExitWatcher>> ExitWatcher::Watch(asio::io_context& io, pid_t pid,
                                                          Callback on_exit) {
  // glibc declares pidfd_open without C linkage for C++; the system call is the same.
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return PosixError("pidfd_open for pid " + std::to_string(pid), errno);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return std::unique_ptr<ExitWatcher>(new PidfdWatcher(io, pid, fd, std::move(on_exit)));
}

StatusOr<std::unique_ptr<GroupGuard>> GroupGuard::Start(const std::string& cgroup_dir) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return PosixError("pipe for the group guard", errno);
  const pid_t pid = ::fork();
  if (pid < 0) return PosixError("fork for the group guard", errno);
  if (pid == 0) {
    // The guard: its own session (a kill of crun's process group spares it), deaf to the
    // terminal's signals, holding nothing of crun's but the pipe.
    ::setsid();
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    ::signal(SIGQUIT, SIG_IGN);
    if (p[0] != 3) {
      ::dup2(p[0], 3);
    } else {
      ::fcntl(3, F_SETFD, 0);
    }
    ::close_range(4, ~0U, 0);
    ::close(STDIN_FILENO);
    std::set<pid_t> groups;
    std::int32_t message;
    for (;;) {
      const ssize_t n = ::read(3, &message, sizeof message);
      if (n == sizeof message) {
        if (message > 0) groups.insert(message);
        if (message < 0) groups.erase(-message);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      break;  // EOF: crun is gone (or done)
    }
    for (pid_t g : groups) ::kill(-g, SIGKILL);
    if (!cgroup_dir.empty()) KillAndRemoveCgroup(cgroup_dir);
    ::_exit(0);
  }
  Own(pid);
  ::close(p[0]);
  return std::unique_ptr<GroupGuard>(new GroupGuard(pid, p[1]));
}

GroupGuard::~GroupGuard() {
  ::close(fd_);  // the guard kills whatever is still registered, then exits
  int status;
  ReapOwned(pid_, &status, 0);
}

void GroupGuard::Send(std::int32_t message) {
  ssize_t n;
  do {
    n = ::write(fd_, &message, sizeof message);
  } while (n < 0 && errno == EINTR);
}

void GroupGuard::Add(pid_t pgid) { Send(static_cast<std::int32_t>(pgid)); }
void GroupGuard::Forget(pid_t pgid) { Send(-static_cast<std::int32_t>(pgid)); }

}  // namespace crun::agent
