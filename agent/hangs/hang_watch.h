// HangWatch: declares a worker hung when it has shown no progress for `timeout`
// (--hang-timeout, docs/hangs.md). Progress is counted by whoever sees it: the worker's output
// pumps, its heartbeat pipe, its torchelastic file-timer requests. Each adds to the worker's
// counter, and the watch compares the counters on its ticks (so the cost on a busy worker's
// path is one increment). A worker that is stopped (T) or in uninterruptible sleep (D) makes no
// progress, whatever its counter says. An expired file timer is a hang at once (Expire).
//
// With --hang-after-steps, a worker that reports steps is hung sooner: after the silence its
// StepPace allows (step_pace.h), with `timeout` as the bound.
//
// Runs on the agent's event loop; on_hang runs once per Begin(), with every watched worker.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/hangs/step_pace.h"

namespace crun::agent {

using ProgressCounter = std::shared_ptr<std::uint64_t>;

// One watched worker when a hang was declared.
struct WorkerProgress {
  int local_rank = 0;
  pid_t pid = 0;
  bool hung = false;                   // this worker is the hang (or one of them)
  std::chrono::milliseconds silent{};  // since its last progress
  std::chrono::milliseconds limit{};   // the silence that made it hung (0: not silence)
  char state = '?';                    // its /proc state letter then: R, S, D, T, t, ...
  std::string cause;                   // "no progress for 30.0 s", "torchelastic timer ..."
};

// "running", "sleeping", "stopped (SIGSTOP or a debugger)", "uninterruptible sleep (D)", ...
std::string DescribeState(char state);

class HangWatch {
 public:
  using OnHang = std::function<void(std::vector<WorkerProgress>)>;
  // timeout 0: never declares a hang by silence (an expired file timer still is one).
  // step_factor: --hang-after-steps (0: off).
  HangWatch(boost::asio::io_context& io, std::chrono::milliseconds timeout, OnHang on_hang,
            int step_factor = 0);

  // Starts watching an attempt's worker; its silence starts now.
  void Watch(int local_rank, pid_t pid, ProgressCounter counter);
  // Worker `local_rank` sent a step record (its progress is counted apart, as for any beat).
  void Stepped(int local_rank) { pace_.Stepped(local_rank, std::chrono::steady_clock::now()); }
  // The worker exited; it is no longer watched.
  void Forget(int local_rank);
  // Worker `local_rank` is hung now, for `cause` (a file timer expired).
  void Expire(int local_rank, std::string cause);
  // The attempt is ending: nothing more is declared until the next Watch.
  void Stop();

  std::chrono::milliseconds timeout() const { return timeout_; }
  const StepPace& pace() const { return pace_; }
  std::chrono::milliseconds tick() const { return tick_; }

 private:
  struct Watched {
    int local_rank = 0;
    pid_t pid = 0;
    ProgressCounter counter;
    std::uint64_t seen = 0;
    std::chrono::steady_clock::time_point last_progress;
    char state = '?';
  };
  void Arm();
  void Tick();
  void Declare(int expired_rank, std::string cause);

  boost::asio::steady_timer timer_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds tick_;
  StepPace pace_;
  OnHang on_hang_;
  std::vector<Watched> watched_;
  bool armed_ = false;
  bool declared_ = false;
  std::chrono::steady_clock::time_point due_;  // when the armed tick should come
};

}  // namespace crun::agent
