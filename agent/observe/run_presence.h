// What says that a crun runs, and lets tools reach it, in its log directory and on its
// control socket: crun.pid (`crun stacks --log-dir`), the control socket (`crun stacks PID`),
// and the Python hook (python/sitecustomize.py) that lets Python workers' stacks be read.
// All of it ends with the run: Close() removes what it wrote. The log directory is this crun's
// alone (mkdtemp), so nothing of anyone else's is named.
//
// Single-threaded, on the io_context given.
#pragma once

#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

#include "agent/hangs/control_socket.h"

namespace crun::agent {

class RunPresence {
 public:
  // `interpreter`: how Python workers' interpreter was chosen; "" for native workers, which
  // get no hook (their stacks are read by eu-stack or gdb).
  RunPresence(boost::asio::io_context& io, std::string log_dir, std::string interpreter)
      : io_(io), log_dir_(std::move(log_dir)), interpreter_(std::move(interpreter)) {}

  // Before the first worker starts, so that a run that never starts one leaves its log
  // directory empty; once. A failure is logged: Python stacks then need py-spy. Also writes
  // the crun_worker module (worker_sdk/python/crun_worker.py) into a directory of its own,
  // which stays on the path when the hook takes its own off.
  void WritePythonHook();
  // The directory that holds the hook, for the workers' PYTHONPATH; "" when not written.
  const std::string& python_dir() const { return python_dir_; }
  // The directory that holds crun_worker.py, after the hook's on PYTHONPATH; "" when not written.
  const std::string& python_sdk_dir() const { return python_sdk_dir_; }
  // Once workers run, off the path to starting them: the control socket, answered by
  // `handler`, and crun.pid; once. A failure is logged: `crun stacks` then cannot reach crun.
  void Announce(ControlServer::Handler handler);
  // The run is over: the socket closes and crun.pid and the hook are removed.
  void Close();

 private:
  boost::asio::io_context& io_;
  std::string log_dir_;
  std::string interpreter_;
  std::string python_dir_;
  std::string python_sdk_dir_;
  bool hook_tried_ = false;
  bool announced_ = false;
  std::unique_ptr<ControlServer> control_;
};

}  // namespace crun::agent
