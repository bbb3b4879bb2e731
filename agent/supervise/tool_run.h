// One run of a short-lived helper program as crun's child: a stack tool (docs/hangs.md), a
// health check (docs/health.md). Its output (stdout and stderr together, the first 4 MiB) and
// how it ended come back on the event loop; at the deadline its process group is killed, and
// the run ends then even when a descendant it left behind still holds the output pipe open.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/supervise/children.h"
#include "agent/supervise/exit_status.h"

namespace crun::agent {

struct ToolSpec {
  std::vector<std::string> argv;  // argv[0] is looked up on PATH when it has no '/'
  std::vector<std::string> envp;  // "KEY=VALUE"; empty: PATH=/usr/bin:/bin and LC_ALL=C
};

struct ToolResult {
  bool started = false;    // false: `error` says why it could not start
  bool timed_out = false;  // killed at the deadline
  ExitStatus exit;         // when started and not timed out
  std::string output;      // stdout and stderr together, as far as read
  std::string error;       // why it did not start

  bool ok() const { return started && !timed_out && exit.success(); }
};

// Runs `spec` as a child owned in `children` (which must outlive the run) and calls `done` once,
// on `io`, never from inside this call. The function returned kills the run's process group
// while it runs (`done` still comes, as a kill); later, it does nothing.
std::function<void()> RunTool(boost::asio::io_context& io, ChildRegistry& children, ToolSpec spec,
                              std::chrono::milliseconds deadline,
                              std::function<void(ToolResult)> done);

}  // namespace crun::agent
