// The read end of a pipe whose write end a worker inherits (ProcessSpec::inherit_fds) and names
// in its environment: its heartbeat (CRUN_HEARTBEAT_FD) and the Python hook's stacks
// (CRUN_STACKS_FD). crun reads it all the time, so that the worker never blocks writing; the
// write end is non-blocking besides. After each read the pipe is left unwatched for a
// millisecond (as LinePump does): a worker beating on every step of a fast loop would otherwise
// wake crun for every beat. On the agent's event loop.
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "base/status.h"

namespace crun::agent {

class WorkerPipe {
 public:
  using OnData = std::function<void(std::string_view)>;
  // `pipe_size` > 0: asks the kernel for that much room (F_SETPIPE_SZ).
  static StatusOr<std::unique_ptr<WorkerPipe>> Create(boost::asio::io_context& io, OnData on_data,
                                                      int pipe_size = 0);
  ~WorkerPipe();
  WorkerPipe(const WorkerPipe&) = delete;
  WorkerPipe& operator=(const WorkerPipe&) = delete;

  // The write end, for the worker; crun closes its copy once the worker has started.
  int child_fd() const { return child_fd_; }
  void CloseChildEnd();
  // crun's end (for fcntl: F_SETPIPE_SZ when a large write is expected).
  int read_fd() const { return read_fd_; }
  // Reads what the pipe holds now, at once, without waiting for the event loop's turn: what a
  // worker wrote before it exited counts before its exit is acted on.
  void Drain();

 private:
  WorkerPipe(boost::asio::io_context& io, int read_fd, int write_fd, OnData on_data);
  void Read();
  void Pause();
  int read_fd_;
  boost::asio::posix::stream_descriptor pipe_;  // holds read_fd_ while watched
  boost::asio::steady_timer pause_;
  int child_fd_;
  OnData on_data_;
  char chunk_[16384];
  // Expires with this pipe: a handler whose operation completed before the pipe was destroyed
  // (queued in the same turn of the loop) sees it and does nothing.
  std::shared_ptr<const char> alive_ = std::make_shared<const char>('\0');
};

}  // namespace crun::agent
