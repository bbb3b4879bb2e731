#include "agent/workers/worker_group.h"

#include <signal.h>

#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "agent/supervise/children.h"
#include "base/proc.h"

namespace crun::agent {
namespace {

// Whether `pid` is stopped (SIGSTOP, SIGTSTP, a tracer).
bool IsStopped(pid_t pid) {
  const std::optional<char> state = ProcessState(pid);
  return state == 'T' || state == 't';
}

}  // namespace

WorkerGroup::WorkerGroup(boost::asio::io_context& io, const AgentOptions& options)
    : io_(io), options_(options) {}

WorkerGroup::~WorkerGroup() = default;

Status WorkerGroup::Prepare() {
  if (auto cgroup = WorkerCgroup::Create(); cgroup.ok()) {
    cgroup_ = std::move(cgroup).value();
    spdlog::info("workers run in cgroup {}", cgroup_->dir());
  } else {
    spdlog::info(
        "no cgroup for the workers ({}): daemonised descendants are ended at the end of each "
        "attempt, but would survive a SIGKILL of crun",
        cgroup.status().message());
  }
  auto g = GroupGuard::Start(registry_, cgroup_dir());
  if (!g.ok()) return g.status();
  guard_ = std::move(g).value();
  if (auto sub = BecomeSubreaper(); !sub.ok()) {
    spdlog::warn("{}: a worker's daemonised descendants may outlive the job", sub.message());
  }
  // Orphans that come to crun are reaped as they end; an attempt's edge looks again.
  auto child_signals = ChildSignals::Open(io_, [this] {
    registry_.ReapOrphans();
    if (edge_) edge_->Notify();
  });
  if (!child_signals.ok()) return child_signals.status();
  children_ = std::move(child_signals).value();
  return Status::Ok();
}

std::vector<WorkerStart> WorkerGroup::Start(int attempt, AttemptStartContext context,
                                            WorkerStreams& streams) {
  edge_.reset();
  attempt_cgroup_.reset();
  if (cgroup_) {
    auto a = AttemptCgroup::Create(*cgroup_, attempt);
    if (a.ok()) {
      attempt_cgroup_ = std::move(a).value();
      context.cgroup_fd = attempt_cgroup_->fd();
      context.cgroup_dir = attempt_cgroup_->dir();
    } else {
      spdlog::warn("{}: this attempt's workers run without a cgroup of their own",
                   a.status().message());
    }
  }
  context.warm = warm_.get();
  context.children = &registry_;
  auto starts = StartWorkers(io_, options_, context, streams, workers_);
  for (const auto& s : starts) {
    if (s.launch.started) guard_->Add(at(s.launch.local_rank).pid);
  }
  return starts;
}

void WorkerGroup::Exited(int lr, ExitStatus exit) {
  Worker& w = at(lr);
  w.running = false;
  w.exit = exit;
}

void WorkerGroup::Signal(const lifecycle::SignalWorkers& a, int base_rank) {
  using Why = lifecycle::SignalWorkers::Why;
  for (int lr : a.local_ranks) {
    const Worker& w = at(lr);
    if (!w.running) continue;
    if (a.why == Why::kGraceOver) {
      spdlog::warn("local rank {} (pid {}) still running {} ms after the stop signal: SIGKILL", lr,
                   w.pid, options_.shutdown_timeout.count());
    }
    ::kill(-w.pid, a.signo);
    if (a.why == Why::kStop && IsStopped(w.pid)) {
      // A stopped process keeps the signal pending and would only meet SIGKILL at the end of
      // the grace: let it run, so that it can act on the signal now.
      spdlog::warn(
          "rank {} (pid {}) was stopped (SIGSTOP or a debugger): sending SIGCONT so that it can "
          "act on {}",
          base_rank + lr, w.pid, SignalName(a.signo));
      ::kill(-w.pid, SIGCONT);
    }
  }
}

void WorkerGroup::BeginEdge(int attempt_label, std::function<void(bool complete)> done) {
  std::vector<pid_t> groups;
  for (const auto& w : workers_) {
    if (w.pid > 0) groups.push_back(w.pid);
  }
  edge_ =
      std::make_unique<AttemptEdge>(io_, attempt_label, std::move(groups),
                                    std::move(attempt_cgroup_), registry_, options_.edge_timeout,
                                    [this, done = std::move(done)](const EdgeReport& r) {
                                      OnEdge(r);
                                      done(r.complete);
                                    });
  edge_->Start();
}

// The edge's words: nothing at warning level for the ordinary case of a worker's children
// ending with it.
void WorkerGroup::OnEdge(const EdgeReport& r) {
  if (r.in_groups > 0) {
    spdlog::debug("attempt {}: ended {} process(es) still in the workers' process groups",
                  r.attempt, r.in_groups);
  }
  if (r.left_count > 0) {
    spdlog::warn(
        "attempt {}: ended {} process(es) that had left their worker's process group (setsid "
        "or daemonised): {}{}",
        r.attempt, r.left_count, fmt::join(r.left, ", "),
        r.left_count > static_cast<int>(r.left.size()) ? ", ..." : "");
  }
  if (!r.complete) {
    spdlog::error(
        "attempt {}: still running {} ms after SIGKILL: {}; no further attempt starts beside "
        "them",
        r.attempt, options_.edge_timeout.count(), fmt::join(r.remaining, ", "));
  } else if (!r.remaining.empty()) {
    spdlog::warn("attempt {}: {}", r.attempt, fmt::join(r.remaining, ", "));
  }
  spdlog::debug("attempt {}: its edge took {} us", r.attempt, r.took.count());
}

void WorkerGroup::EndAttempt() {
  for (const auto& w : workers_) {
    if (w.pid > 0) guard_->Forget(w.pid);
  }
}

std::string WorkerGroup::DescribeExits(int base_rank) const {
  std::string how;
  for (const auto& w : workers_) {
    if (w.pid <= 0) continue;
    how += (how.empty() ? "" : ", ") + std::string("rank ") +
           std::to_string(base_rank + w.local_rank) + " " + w.exit.Describe();
  }
  return how;
}

void WorkerGroup::StartWarm(WarmOptions options) {
  warm_ = std::make_unique<WarmTemplate>(io_, std::move(options), cgroup_.get(), guard_.get(),
                                         registry_);
  warm_->Start();
}

void WorkerGroup::WhenReadyToStart(std::function<void()> done) {
  if (!warm_) return done();
  warm_->WhenSettled(std::move(done));
}

void WorkerGroup::Close() {
  warm_.reset();
  for (auto& w : workers_) {
    w.heartbeat.reset();
    w.stacks.reset();
  }
  // Posted: Close may run inside the SIGCHLD handler.
  boost::asio::post(io_, [this] { children_.reset(); });
}

Worker& WorkerGroup::at(int lr) {
  return workers_[static_cast<std::size_t>(lr - options_.first_local_rank)];
}

Worker* WorkerGroup::OfPid(pid_t pid) {
  const pid_t group_id = ::getpgid(pid);
  pid_t p = pid;
  for (int depth = 0; depth < 64 && p > 1; ++depth) {
    for (auto& w : workers_) {
      if (w.running && (w.pid == p || (depth == 0 && w.pid == group_id))) return &w;
    }
    const auto parent = ParentOf(p);
    if (!parent) break;
    p = *parent;
  }
  return nullptr;
}

int WorkerGroup::running() const {
  int n = 0;
  for (const auto& w : workers_) n += w.running ? 1 : 0;
  return n;
}

int WorkerGroup::exited() const {
  int n = 0;
  for (const auto& w : workers_) n += !w.running && w.pid > 0 ? 1 : 0;
  return n;
}

std::string WorkerGroup::cgroup_dir() const { return cgroup_ ? cgroup_->dir() : std::string(); }

std::vector<std::string> StderrTail(const Worker& w) {
  if (w.err_pump) return {w.err_pump->tail().begin(), w.err_pump->tail().end()};
  return FileTail(w.dir + "/stderr.log", 20);
}

}  // namespace crun::agent
