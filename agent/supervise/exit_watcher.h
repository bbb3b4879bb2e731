// ExitWatcher: calls back on the event loop the moment a child exits (pidfd readiness, no
// polling) and reaps it (ChildRegistry).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>

#include <boost/asio/io_context.hpp>

#include "agent/supervise/children.h"
#include "agent/supervise/exit_status.h"
#include "base/status.h"

namespace crun::agent {

class ExitWatcher {
 public:
  using Callback = std::function<void(ExitStatus)>;
  // Watches `pid`, a child owned in `children` (which must outlive the watcher), and reaps it
  // there. The callback runs once, on `io`'s thread.
  static StatusOr<std::unique_ptr<ExitWatcher>> Watch(boost::asio::io_context& io, pid_t pid,
                                                      ChildRegistry& children, Callback on_exit);
  virtual ~ExitWatcher() = default;
};

}  // namespace crun::agent
