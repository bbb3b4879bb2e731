#include "agent/attempt_failures.h"

#include <signal.h>

#include <algorithm>

#include "agent/worker_group.h"

namespace crun::agent {

void AttemptFailures::Clear() {
  records_.clear();
  hang_.reset();
}

FailureRecord AttemptFailures::New(int rank, int lr, ExitStatus exit) const {
  FailureRecord f;
  f.host = host_;
  f.rank = rank;
  f.local_rank = lr;
  f.exit = exit;
  f.when = std::chrono::system_clock::now();
  return f;
}

void AttemptFailures::LaunchFailed(int rank, int lr, int code, const std::string& why) {
  FailureRecord f = New(rank, lr, ExitStatus{false, code});
  f.stderr_tail = {why};
  records_.push_back(std::move(f));
}

const FailureRecord& AttemptFailures::Exited(Worker& w, int rank, ExitStatus exit,
                                             std::string oom) {
  FailureRecord f = New(rank, w.local_rank, exit);
  f.pid = w.pid;
  f.oom = std::move(oom);
  f.error_file = w.error_file;
  f.error = ReadErrorFile(w.error_file);
  if (w.err_pump) w.err_pump->DrainAvailable();
  f.stderr_tail = StderrTail(w);
  records_.push_back(std::move(f));
  return records_.back();
}

void AttemptFailures::NoteHang(HangReport report, std::chrono::system_clock::time_point when) {
  hang_ = std::move(report);
  hang_when_ = when;
}

void AttemptFailures::Hung(const Worker& w, int rank) {
  FailureRecord f = New(rank, w.local_rank, ExitStatus{true, SIGTERM});
  f.when = hang_when_;
  f.pid = w.pid;
  f.error_file = w.error_file;
  if (hang_) {
    for (const auto& r : hang_->ranks) {
      if (r.local_rank == w.local_rank) f.hang = r.cause;
    }
  }
  if (f.hang.empty()) f.hang = "hung";
  records_.push_back(std::move(f));
  SortByTime();
}

void AttemptFailures::HangEnded(const Worker& w, ExitStatus exit) {
  for (auto& f : records_) {
    if (f.local_rank == w.local_rank && !f.hang.empty()) {
      f.exit = exit;
      f.error = ReadErrorFile(w.error_file);
      return;
    }
  }
}

void AttemptFailures::Complete(const std::function<std::vector<std::string>(int lr)>& tail) {
  SortByTime();
  for (auto& f : records_) {
    if (f.pid != 0) f.stderr_tail = tail(f.local_rank);
  }
}

const HangReport* AttemptFailures::HangBehind(const std::vector<FailureRecord>& report) const {
  if (!hang_ || report.empty() || report.front().hang.empty()) return nullptr;
  return &*hang_;
}

void AttemptFailures::SortByTime() {
  std::stable_sort(records_.begin(), records_.end(),
                   [](const auto& a, const auto& b) { return a.when < b.when; });
}

}  // namespace crun::agent
