#include "agent/hangs/hang_watch.h"

#include <algorithm>
#include <cstdio>

#include "base/proc.h"

namespace crun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string Seconds(milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms.count()) / 1000.0);
  return text;
}

bool MakesNoProgress(char state) { return state == 'T' || state == 't' || state == 'D'; }

}  // namespace

std::string DescribeState(char state) {
  switch (state) {
    case 'R':
      return "running";
    case 'S':
      return "sleeping";
    case 'D':
      return "in uninterruptible sleep (D: waiting on a device or file system)";
    case 'T':
      return "stopped (T: SIGSTOP or SIGTSTP)";
    case 't':
      return "stopped by a debugger (t)";
    case 'Z':
      return "exited, not yet reaped";
    default:
      return std::string("state ") + state;
  }
}

HangWatch::HangWatch(boost::asio::io_context& io, milliseconds timeout, OnHang on_hang,
                     int step_factor)
    : timer_(io), timeout_(timeout), pace_(step_factor, timeout), on_hang_(std::move(on_hang)) {
  // Ten looks per timeout bound how late a hang is seen; one a second at most is enough
  // for any human-scale timeout, and reading a few /proc files per worker costs microseconds.
  // Paced by steps, the shortest limit is the pace's floor.
  const milliseconds shortest = step_factor > 0 ? std::min(timeout_, kStepHangFloor) : timeout_;
  tick_ = std::clamp(shortest / 10, milliseconds(10), milliseconds(1000));
}

void HangWatch::Watch(int local_rank, pid_t pid, ProgressCounter counter) {
  Forget(local_rank);
  pace_.Started(local_rank);
  declared_ = false;
  Watched w;
  w.local_rank = local_rank;
  w.pid = pid;
  w.seen = counter ? *counter : 0;
  w.counter = std::move(counter);
  w.last_progress = Clock::now();
  watched_.push_back(std::move(w));
  if (timeout_.count() > 0 && !armed_) Arm();
}

void HangWatch::Forget(int local_rank) {
  std::erase_if(watched_, [&](const Watched& w) { return w.local_rank == local_rank; });
}

void HangWatch::Stop() {
  watched_.clear();
  timer_.cancel();
  armed_ = false;
}

void HangWatch::Expire(int local_rank, std::string cause) {
  if (declared_) return;
  for (auto& w : watched_) {
    if (w.local_rank == local_rank) w.state = ProcessState(w.pid).value_or('?');
  }
  Declare(local_rank, std::move(cause));
}

void HangWatch::Arm() {
  armed_ = true;
  due_ = Clock::now() + tick_;
  timer_.expires_at(due_);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    armed_ = false;
    Tick();
    if (!declared_ && !watched_.empty()) Arm();
  });
}

void HangWatch::Tick() {
  if (declared_) return;
  const auto now = Clock::now();
  // A tick that comes late found crun's own loop stalled (a starved machine, crun stopped):
  // what the workers wrote meanwhile is still unread in their pipes, so that time is not their
  // silence.
  if (const auto late = now - due_; late > tick_) {
    for (auto& w : watched_) w.last_progress = std::min(now, w.last_progress + late);
  }
  bool hung = false;
  for (auto& w : watched_) {
    w.state = ProcessState(w.pid).value_or('?');
    const std::uint64_t count = w.counter ? *w.counter : 0;
    if (count != w.seen && !MakesNoProgress(w.state)) w.last_progress = now;
    w.seen = count;
    if (now - w.last_progress >= pace_.LimitFor(w.local_rank)) hung = true;
  }
  if (hung) Declare(-1, "");
}

void HangWatch::Declare(int expired_rank, std::string cause) {
  declared_ = true;
  timer_.cancel();
  armed_ = false;
  const auto now = Clock::now();
  std::vector<WorkerProgress> all;
  milliseconds paced_silence{0};
  for (const auto& w : watched_) {
    WorkerProgress p;
    p.local_rank = w.local_rank;
    p.pid = w.pid;
    p.silent = std::chrono::duration_cast<milliseconds>(now - w.last_progress);
    p.state = w.state;
    if (w.local_rank == expired_rank) {
      p.hung = true;
      p.cause = cause;
    } else if (const milliseconds limit = pace_.LimitFor(w.local_rank);
               expired_rank < 0 && p.silent >= limit) {
      p.hung = true;
      p.cause = "no progress for " + Seconds(p.silent);
      if (pace_.Paced(w.local_rank)) {
        p.cause += " (--hang-after-steps " + std::to_string(pace_.factor()) + ": its limit is " +
                   Seconds(limit) + ", from the longest step, " + Seconds(pace_.longest()) + ")";
        paced_silence = std::max(paced_silence, p.silent);
      }
      p.limit = limit;
    }
    if (p.hung && MakesNoProgress(p.state)) p.cause += "; it was " + DescribeState(p.state);
    all.push_back(std::move(p));
  }
  pace_.Declared(paced_silence);
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a.local_rank < b.local_rank; });
  on_hang_(std::move(all));
}

}  // namespace crun::agent
