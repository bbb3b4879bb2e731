// The read end of one worker's CRUN_STACKS_FD, the pipe crun's Python hook (python_hook.h)
// writes its stacks to.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/hangs/worker_pipe.h"
#include "base/status.h"

namespace crun::agent {

// The read end of one worker's CRUN_STACKS_FD (the Python hook's pipe). Owned by the agent for
// the worker's life; it reads all the time, so that the worker never blocks writing.
class StackPipe {
 public:
  static StatusOr<std::unique_ptr<StackPipe>> Create(boost::asio::io_context& io);
  // A request still open ends with what came (its worker is gone).
  ~StackPipe();
  // The write end, for the worker (ProcessSpec::inherit_fds); crun closes it once started.
  int child_fd() const { return pipe_->child_fd(); }
  void CloseChildEnd() { pipe_->CloseChildEnd(); }
  // Asks the hook in `pid` for its stacks and collects what it writes. First the safe signal
  // (when `pid` catches it): the hook answers at the main thread's next safe point, between
  // two bytecodes, with the dump between two marker lines; complete at the end marker. With
  // no answer within `safe_wait` the main thread is blocked in C code (a collective, a lock):
  // then the at-once signal, answered from the signal handler; complete once nothing more
  // came for `quiet` after the first bytes, or at `deadline`. `done(text, at_once)`: the
  // dump (empty when nothing came), and whether it was the at-once one.
  struct Timing {
    std::chrono::milliseconds safe_wait{100}, quiet{100}, deadline{3000};
  };
  void Request(pid_t pid, Timing timing, std::function<void(std::string, bool)> done);

 private:
  explicit StackPipe(boost::asio::io_context& io);
  void OnData(std::string_view data);
  void AskAtOnce();
  void Finish();
  std::unique_ptr<WorkerPipe> pipe_;
  boost::asio::steady_timer step_timer_, deadline_timer_;
  pid_t pid_ = 0;
  bool at_once_ = false;  // the at-once signal was sent
  std::chrono::milliseconds quiet_{};
  std::string buffer_;
  std::function<void(std::string, bool)> done_;
};

}  // namespace crun::agent
