// A running crun's control socket, for `crun stacks PID` (docs/hangs.md): a Unix socket in the
// abstract namespace named "crun/<pid>/control", so nothing is created on disk and nothing is
// left behind when crun dies. Only processes of crun's own user (or root) are answered; the
// kernel tells who the peer is (SO_PEERCRED).
//
// Protocol: the client sends one request line ("stacks\n"); crun answers with one JSON
// document and closes the connection.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include "base/status.h"

namespace crun::agent {

// "\0crun/<pid>/control" (with its leading NUL).
std::string ControlSocketName(pid_t pid);

class ControlServer {
 public:
  // `handler` answers one request through `reply`, possibly later (on the event loop).
  using Handler =
      std::function<void(const std::string& request, std::function<void(std::string)> reply)>;
  static StatusOr<std::unique_ptr<ControlServer>> Listen(boost::asio::io_context& io,
                                                         Handler handler);
  ~ControlServer();

 private:
  ControlServer(boost::asio::io_context& io, Handler handler);
  void Accept();
  boost::asio::io_context& io_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  Handler handler_;
};

// Sends `request` to the crun with `pid` and returns its answer; errors name the pid.
StatusOr<std::string> AskControl(pid_t pid, const std::string& request,
                                 std::chrono::milliseconds timeout);

}  // namespace crun::agent
