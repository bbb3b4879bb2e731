// The end of one attempt (docs/reliability.md, "The attempt's edge"). Once every worker of the
// attempt has exited and been reaped, everything else the attempt started is ended and reaped
// before the agent may start the next one, so that nothing that ends attempt N can reach a
// process of attempt N+1:
// * SIGKILL to each worker's process group: the children that stayed in it (a shell's commands,
//   DataLoader and multiprocessing workers);
// * SIGKILL to the attempt's own cgroup (AttemptCgroup), which holds every descendant,
//   daemonised or not;
// * SIGKILL to every orphan child of crun (crun is their subreaper), with its process group:
//   without a cgroup, that is how a descendant that left its group (setsid) is found.
// Then it waits until the cgroup is empty and every orphan child is reaped, woken by SIGCHLD
// (Notify) and by a short backstop timer, removes the cgroup and reports. Past its deadline it
// reports what is still there instead.
//
// Single-threaded: everything runs on the io_context given; done may run inside Start().
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/supervise/children.h"
#include "agent/supervise/worker_cgroup.h"
#include "base/status.h"

namespace crun::agent {

inline constexpr std::chrono::milliseconds kDefaultEdgeTimeout{30'000};

struct EdgeReport {
  int attempt = 0;
  // Processes the edge ended that were still in a worker's process group: the ordinary case.
  int in_groups = 0;
  // Those that had left their worker's process group (setsid, daemonised): "pid 12 (sleep)",
  // the first few; left_count counts them all.
  std::vector<std::string> left;
  int left_count = 0;
  // False when something was still there at the deadline: `remaining` names it with its state.
  bool complete = true;
  std::vector<std::string> remaining;
  std::chrono::microseconds took{0};
};

class AttemptEdge {
 public:
  using Done = std::function<void(const EdgeReport&)>;
  // `groups`: the process groups of the attempt's workers (their pids). `cgroup`: the attempt's
  // cgroup, or null where crun has none. `children`: this process's registry (which must
  // outlive the edge): a child it does not own is an orphan, the edge's to end and reap.
  AttemptEdge(boost::asio::io_context& io, int attempt, std::vector<pid_t> groups,
              std::unique_ptr<AttemptCgroup> cgroup, ChildRegistry& children,
              std::chrono::milliseconds timeout, Done done);
  ~AttemptEdge();
  AttemptEdge(const AttemptEdge&) = delete;
  AttemptEdge& operator=(const AttemptEdge&) = delete;

  // Kills and looks: done runs now if nothing is left.
  void Start();
  // A child of crun changed state (SIGCHLD): look again.
  void Notify();
  bool finished() const { return finished_; }

 private:
  void Check();
  // Notes `pid` once, as in a worker's group or as having left it.
  void Classify(pid_t pid);
  void Finish(bool complete);

  boost::asio::io_context& io_;
  ChildRegistry& children_;
  std::vector<pid_t> groups_;
  std::unique_ptr<AttemptCgroup> cgroup_;
  std::chrono::steady_clock::time_point started_, deadline_;
  Done done_;
  EdgeReport report_;
  std::set<pid_t> seen_;
  boost::asio::steady_timer backstop_;
  bool finished_ = false;
};

// SIGCHLD as an event on the io_context: blocks it in the calling thread (crun's main() blocks
// it before any thread starts, so that no other thread takes it) and reads it from a signalfd.
// `on_child` runs after each batch of SIGCHLDs.
class ChildSignals {
 public:
  static StatusOr<std::unique_ptr<ChildSignals>> Open(boost::asio::io_context& io,
                                                      std::function<void()> on_child);

 private:
  ChildSignals(boost::asio::io_context& io, int fd, std::function<void()> on_child);
  void Wait();
  boost::asio::posix::stream_descriptor fd_;
  std::function<void()> on_child_;
};

// Blocks SIGCHLD in the calling thread, and so in the threads it starts later (ChildSignals).
void BlockChildSignal();

}  // namespace crun::agent
