#include "agent/hangs/worker_pipe.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "agent/output/pipe_pause.h"

namespace crun::agent {

StatusOr<std::unique_ptr<WorkerPipe>> WorkerPipe::Create(boost::asio::io_context& io,
                                                         OnData on_data, int pipe_size) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return PosixError("pipe for a worker", errno);
  if (pipe_size > 0) ::fcntl(p[1], F_SETPIPE_SZ, pipe_size);  // best effort
  return std::unique_ptr<WorkerPipe>(new WorkerPipe(io, p[0], p[1], std::move(on_data)));
}

WorkerPipe::WorkerPipe(boost::asio::io_context& io, int read_fd, int write_fd, OnData on_data)
    : read_fd_(read_fd),
      pipe_(io, read_fd),
      pause_(io),
      child_fd_(write_fd),
      on_data_(std::move(on_data)) {
  Read();
}

WorkerPipe::~WorkerPipe() {
  CloseChildEnd();
  pause_.cancel();
  if (pipe_.is_open()) {
    boost::system::error_code ignored;
    pipe_.close(ignored);
  } else if (read_fd_ >= 0) {
    ::close(read_fd_);  // released for a pause
  }
}

void WorkerPipe::CloseChildEnd() {
  if (child_fd_ >= 0) ::close(child_fd_);
  child_fd_ = -1;
}

void WorkerPipe::Drain() {
  // A buffer of its own: a read the event loop has done may still wait in chunk_.
  char buf[4096];
  while (read_fd_ >= 0) {
    const ssize_t n = ::read(read_fd_, buf, sizeof buf);
    if (n <= 0) return;  // empty (EAGAIN), or every writer is gone
    on_data_(std::string_view(buf, static_cast<std::size_t>(n)));
  }
}

void WorkerPipe::Read() {
  pipe_.async_read_some(boost::asio::buffer(chunk_),
                        [this, owner = std::weak_ptr<const void>(
                                   alive_)](const boost::system::error_code& ec, std::size_t n) {
                          // Closed, or the worker and its children are gone; or this pipe was
                          // destroyed after the read had completed.
                          if (ec || owner.expired()) return;
                          on_data_(std::string_view(chunk_, n));
                          Pause();
                        });
}

void WorkerPipe::Pause() {
  PausePipe(
      pipe_, read_fd_, pause_, alive_, [this] { Read(); },
      [this] {  // cannot watch it again: nothing more is read
        ::close(read_fd_);
        read_fd_ = -1;
      });
}

}  // namespace crun::agent
