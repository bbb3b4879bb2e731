#include "agent/failures/attempt_failures.h"

#include <signal.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "agent/workers/worker_group.h"

namespace crun::agent {

void AttemptFailures::Clear() {
  report_.failures.clear();
  hang_.reset();
  slow_.clear();
}

namespace {

std::int64_t UnixMs(std::chrono::system_clock::time_point when) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
}

}  // namespace

report::WorkerFailure AttemptFailures::New(int rank, int lr, ExitStatus exit) {
  report::WorkerFailure f;
  f.rank = rank;
  f.local_rank = lr;
  SetExit(f, exit);
  f.time_unix_ms = NowUnixMs();
  return f;
}

void AttemptFailures::LaunchFailed(int rank, int lr, int code, const std::string& why) {
  report::WorkerFailure f = New(rank, lr, ExitStatus{false, code});
  f.stderr_tail = {why};
  report_.failures.push_back(std::move(f));
}

const report::WorkerFailure& AttemptFailures::Exited(Worker& w, int rank, ExitStatus exit,
                                                     std::string oom) {
  report::WorkerFailure f = New(rank, w.local_rank, exit);
  f.pid = w.pid;
  f.oom = std::move(oom);
  f.error_file = w.error_file;
  ReadErrorFile(w.error_file, f);
  if (w.err_pump) w.err_pump->DrainAvailable();
  f.stderr_tail = StderrTail(w);
  report_.failures.push_back(std::move(f));
  return report_.failures.back();
}

void AttemptFailures::NoteHang(HangReport report, std::chrono::system_clock::time_point when) {
  hang_ = std::move(report);
  hang_when_ms_ = UnixMs(when);
}

void AttemptFailures::NoteSlow(int lr, std::string why,
                               std::chrono::system_clock::time_point when) {
  slow_[lr] = Slow{std::move(why), UnixMs(when)};
}

void AttemptFailures::Hung(const Worker& w, int rank) {
  report::WorkerFailure f = New(rank, w.local_rank, ExitStatus{true, SIGTERM});
  f.time_unix_ms = hang_when_ms_;
  f.pid = w.pid;
  f.error_file = w.error_file;
  if (auto slow = slow_.find(w.local_rank); slow != slow_.end()) {
    f.slow = slow->second.why;  // stopped as slow (--straggler-action restart), not hung
    f.time_unix_ms = slow->second.when_ms;
  } else {
    if (hang_) {
      for (const auto& r : hang_->ranks) {
        if (r.local_rank == w.local_rank) f.hang = r.cause;
      }
    }
    if (f.hang.empty()) f.hang = "hung";
  }
  report_.failures.push_back(std::move(f));
  SortByTime();
}

void AttemptFailures::HangEnded(const Worker& w, ExitStatus exit) {
  for (auto& f : report_.failures) {
    if (f.local_rank == w.local_rank && (!f.hang.empty() || !f.slow.empty())) {
      SetExit(f, exit);
      ReadErrorFile(w.error_file, f);
      return;
    }
  }
}

void AttemptFailures::Complete(const std::function<std::vector<std::string>(int lr)>& tail) {
  SortByTime();
  for (auto& f : report_.failures) {
    if (f.pid != 0) f.stderr_tail = tail(f.local_rank);
  }
}

const HangReport* AttemptFailures::HangBehind(const report::FailureReport& report) const {
  if (!hang_ || report.failures.empty() || report.failures.front().hang.empty()) return nullptr;
  return &*hang_;
}

void AttemptFailures::SortByTime() {
  std::stable_sort(report_.failures.begin(), report_.failures.end(),
                   [](const auto& a, const auto& b) { return a.time_unix_ms < b.time_unix_ms; });
}

void WarnStopping(const report::WorkerFailure& f, const ExitStatus& exit, const std::string& host,
                  int group_size) {
  const int others = group_size - 1;
  spdlog::warn("rank {} (local rank {}, pid {}) on {} failed with {}{}; {}", f.rank, f.local_rank,
               f.pid, host, exit.Describe(), f.oom.empty() ? "" : ": " + f.oom,
               others <= 0   ? std::string("it was this node's only worker")
               : others == 1 ? std::string("stopping the other worker")
                             : "stopping the other " + std::to_string(others) + " workers");
}

}  // namespace crun::agent
