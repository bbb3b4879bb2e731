// torchelastic's file-based expiration timers, served by crun: stock scripts that use
// `torch.distributed.elastic.timer.FileTimerClient` and `expires(after=...)` work unchanged
// (docs/hangs.md). As with torchrun, the server runs when crun's environment has
// TORCHELASTIC_ENABLE_FILE_TIMER=1; workers get the named pipe as TORCHELASTIC_TIMER_FILE.
//
// Protocol (PyTorch's file_based_local_timer.py): each request is one JSON line, written with
// one write() by a client that opens the pipe, writes and closes it:
//   {"version": 1, "pid": P, "scope_id": "file.py#12", "expiration_time": T, "signal": 9}
// T is wall-clock seconds since the epoch; T < 0 releases (pid, scope_id). A timer whose time
// has come is expired: crun treats it as a hang of the worker that holds pid (it or one of its
// descendants), captures stacks and stops the group, rather than only killing the pid.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "base/status.h"

namespace crun::agent {

class FileTimerServer {
 public:
  // Any request from pid (progress); an expiry of (pid, scope), `cause` describing it.
  using OnRequest = std::function<void(pid_t pid)>;
  using OnExpired = std::function<void(pid_t pid, std::string cause)>;

  // Makes the named pipe at `path` and listens on it. A FIFO already there (a crashed run's) is
  // replaced; any other file there is an error naming it: it is never removed.
  static StatusOr<std::unique_ptr<FileTimerServer>> Open(boost::asio::io_context& io,
                                                         const std::string& path,
                                                         OnRequest on_request,
                                                         OnExpired on_expired);
  ~FileTimerServer();  // removes the pipe
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }
  // Drops every timer (an attempt ended: its pids are gone).
  void Clear();
  // Timers held now, and requests that could not be read (for tests and logs).
  std::size_t timers() const { return timers_.size(); }
  std::size_t malformed() const { return malformed_; }

 private:
  FileTimerServer(boost::asio::io_context& io, std::string path, int fd, OnRequest on_request,
                  OnExpired on_expired);
  void Read();
  void Handle(std::string_view line);
  void Schedule();
  void Fire();

  struct Timer {
    double expiration = 0;  // wall-clock seconds
    int signal = 0;
  };
  std::string path_;
  boost::asio::posix::stream_descriptor pipe_;
  boost::asio::steady_timer alarm_;
  OnRequest on_request_;
  OnExpired on_expired_;
  std::map<std::pair<pid_t, std::string>, Timer> timers_;
  std::string pending_;
  std::size_t malformed_ = 0;
  char buffer_[4096];
};

}  // namespace crun::agent
