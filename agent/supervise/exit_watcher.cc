#include "agent/supervise/exit_watcher.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <boost/asio/posix/stream_descriptor.hpp>

#include "agent/supervise/children.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;

class PidfdWatcher final : public ExitWatcher {
 public:
  PidfdWatcher(asio::io_context& io, pid_t pid, ChildRegistry& children, int pidfd, Callback cb)
      : pid_(pid), children_(children), fd_(io, pidfd), callback_(std::move(cb)) {
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
    const pid_t r = children_.Reap(pid_, &status, WNOHANG);
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
  ChildRegistry& children_;
  asio::posix::stream_descriptor fd_;
  Callback callback_;
};

}  // namespace

std::string ExitStatus::Describe() const { return DescribeExit(signaled, value); }

StatusOr<std::unique_ptr<ExitWatcher>> ExitWatcher::Watch(asio::io_context& io, pid_t pid,
                                                          ChildRegistry& children,
                                                          Callback on_exit) {
  // glibc declares pidfd_open without C linkage for C++; the system call is the same.
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return PosixError("pidfd_open for pid " + std::to_string(pid), errno);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return std::unique_ptr<ExitWatcher>(new PidfdWatcher(io, pid, children, fd, std::move(on_exit)));
}

}  // namespace crun::agent
