#include "agent/supervise/attempt_edge.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

#include "agent/supervise/children.h"
#include "base/proc.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;

// How often the edge looks again when no SIGCHLD woke it: a backstop for a SIGCHLD taken by
// a thread that does not block it, and for a cgroup emptied by a process that is not crun's
// child.
constexpr std::chrono::milliseconds kBackstop{20};
constexpr std::size_t kNamed = 5;  // processes named in a report; the rest are counted

// "pid 12 (sleep)", with the state when asked.
std::string Name(pid_t pid, bool with_state) {
  std::string comm;
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::getline(in, comm);
  std::string s = "pid " + std::to_string(pid) + " (" + (comm.empty() ? "?" : comm);
  if (with_state) {
    if (const auto state = ProcessState(pid)) s += ", state " + std::string(1, *state);
  }
  return s + ")";
}

}  // namespace

AttemptEdge::AttemptEdge(asio::io_context& io, int attempt, std::vector<pid_t> groups,
                         std::unique_ptr<AttemptCgroup> cgroup, ChildRegistry& children,
                         std::chrono::milliseconds timeout, Done done)
    : io_(io),
      children_(children),
      groups_(std::move(groups)),
      cgroup_(std::move(cgroup)),
      started_(std::chrono::steady_clock::now()),
      deadline_(started_ + timeout),
      done_(std::move(done)),
      backstop_(io) {
  report_.attempt = attempt;
}

AttemptEdge::~AttemptEdge() { backstop_.cancel(); }

void AttemptEdge::Start() { Check(); }

void AttemptEdge::Notify() {
  if (!finished_) Check();
}

void AttemptEdge::Classify(pid_t pid) {
  if (!seen_.insert(pid).second) return;
  const pid_t group = ::getpgid(pid);
  // Gone since it was listed (the group's SIGKILL above, and a parent that reaped it): it
  // cannot be told apart, and one that left its group would still be there (nothing kills it
  // before this look). Counting it as having left named a shell's `sleep` in 1 of 2,800
  // attempts of the soak.
  if (group < 0) return;
  if (std::find(groups_.begin(), groups_.end(), group) != groups_.end()) {
    ++report_.in_groups;
    return;
  }
  if (report_.left.size() < kNamed) report_.left.push_back(Name(pid, false));
  ++report_.left_count;
}

void AttemptEdge::Check() {
  for (pid_t g : groups_) ::kill(-g, SIGKILL);  // ESRCH once a group is empty
  if (cgroup_ && cgroup_->Populated()) {
    for (pid_t p : cgroup_->Procs()) Classify(p);
    cgroup_->KillAll();
  }
  const pid_t own_group = ::getpgrp();
  for (pid_t c : children_.Orphans()) {
    Classify(c);
    const pid_t group = ::getpgid(c);
    if (group > 0 && group != own_group && !children_.Owns(group)) ::kill(-group, SIGKILL);
    ::kill(c, SIGKILL);
    int status = 0;
    ::waitpid(c, &status, WNOHANG);
  }
  if ((!cgroup_ || !cgroup_->Populated()) && children_.Orphans().empty()) return Finish(true);
  if (std::chrono::steady_clock::now() >= deadline_) return Finish(false);
  backstop_.expires_after(kBackstop);
  backstop_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Notify();
  });
}

void AttemptEdge::Finish(bool complete) {
  finished_ = true;
  backstop_.cancel();
  report_.complete = complete;
  if (complete && cgroup_) {
    if (auto s = cgroup_->Remove(); !s.ok()) report_.remaining.push_back(s.message());
  }
  if (!complete) {
    std::vector<pid_t> left = children_.Orphans();
    if (cgroup_) {
      for (pid_t p : cgroup_->Procs()) {
        if (std::find(left.begin(), left.end(), p) == left.end()) left.push_back(p);
      }
    }
    for (pid_t p : left) {
      if (report_.remaining.size() < kNamed) report_.remaining.push_back(Name(p, true));
    }
    if (left.size() > kNamed) {
      report_.remaining.push_back("and " + std::to_string(left.size() - kNamed) + " more");
    }
  }
  report_.took = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - started_);
  auto done = std::move(done_);
  done(report_);  // may destroy this edge: nothing touches members after this line
}

void BlockChildSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

StatusOr<std::unique_ptr<ChildSignals>> ChildSignals::Open(asio::io_context& io,
                                                           std::function<void()> on_child) {
  BlockChildSignal();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  const int fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) return PosixError("signalfd for SIGCHLD", errno);
  return std::unique_ptr<ChildSignals>(new ChildSignals(io, fd, std::move(on_child)));
}

ChildSignals::ChildSignals(asio::io_context& io, int fd, std::function<void()> on_child)
    : fd_(io, fd), on_child_(std::move(on_child)) {
  Wait();
}

void ChildSignals::Wait() {
  fd_.async_wait(asio::posix::stream_descriptor::wait_read,
                 [this](const boost::system::error_code& ec) {
                   if (ec) return;  // closed: the agent is going
                   signalfd_siginfo info[8];
                   while (::read(fd_.native_handle(), info, sizeof info) > 0) {
                   }
                   on_child_();
                   Wait();
                 });
}

}  // namespace crun::agent
