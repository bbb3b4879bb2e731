// Warm starts (docs/warm.md): a template process per node, a Python interpreter with the
// workers' interpreter and environment that has imported torch (and what else it is asked
// to) and waits. Each worker of each attempt is forked from it instead of started cold, so
// that no worker pays for those imports again. agent/warm/template.py is its other side, and
// says how a forked worker becomes what a cold start makes.
//
// The template is crun's child, in a cgroup of its own below crun's (so that no attempt's
// edge ends it) and under the guard (so that it never outlives crun). A forked worker is
// crun's child too: the template forks twice and the middle process exits, so the worker's
// parent becomes crun, its subreaper. When the template dies it is started again at once;
// until it is ready, and whenever a fork fails, workers start cold, with one warning line.
//
// Single-threaded, on the io_context given. Fork blocks for the template's answer (a few
// milliseconds; kWarmReplyTimeout at most), as a cold start blocks for its fork. Request and
// Collect are Fork in two halves, so that an attempt asks for all its workers before it reads
// the first answer: the template's spares then fork them at the same time (template.py).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/supervise/exit_watcher.h"
#include "agent/supervise/group_guard.h"
#include "agent/supervise/spawn.h"
#include "agent/supervise/worker_cgroup.h"
#include "base/status.h"

namespace crun::agent {

inline constexpr std::chrono::milliseconds kWarmReplyTimeout{10'000};
// How long an attempt waits for a template that is still importing before it starts cold.
inline constexpr std::chrono::milliseconds kWarmReadyTimeout{300'000};
// Templates that may die in a row before they were ready before warm starts stop for the job.
inline constexpr int kWarmMaxFailedStarts = 3;

// What the template imports when nothing else is asked for; "?": skipped where the installed
// torch has no such module (torch._dynamo came with 2.0).
std::vector<std::string> DefaultWarmModules();

struct WarmOptions {
  std::string python;                    // the workers' interpreter: argv[0] of their command
  std::vector<std::string> worker_argv;  // their command line (for the room it needs)
  std::vector<std::string> modules;      // imported in this order; "name?": may be missing
  std::string dir;                       // where the template's source is written
  std::string log_file;                  // its stdout and stderr
  std::vector<std::string> envp;         // its environment, "KEY=VALUE"
  int spares = 0;  // processes it forks ahead, one per worker of the node (template.py)
};

class WarmTemplate {
 public:
  enum class State { kStarting, kReady, kOff };

  // `cgroup`: crun's worker cgroup, or null; `guard` ends the template if crun dies;
  // `children`: where the template and the workers forked from it are owned. All outlive the
  // template.
  WarmTemplate(boost::asio::io_context& io, WarmOptions options, const WorkerCgroup* cgroup,
               GroupGuard* guard, ChildRegistry& children);
  ~WarmTemplate();  // ends the template and reaps it
  WarmTemplate(const WarmTemplate&) = delete;
  WarmTemplate& operator=(const WarmTemplate&) = delete;

  // Starts the template; what goes wrong is logged and leaves it kOff.
  void Start();
  State state() const { return state_; }
  // Runs `done` at once, or, while the first template is still importing, once it is ready or
  // off, or after kWarmReadyTimeout.
  void WhenSettled(std::function<void()> done);
  // Phase one of a warm start of `spec` (a Python worker, `python -u ...`): a process forked
  // from the template, set up as `spec` says, adopted by crun, moved into spec's cgroup and
  // waiting; FinishStart lets it run. `hook`: crun's sitecustomize.py, "" for none. An error
  // says why this worker cannot start warm.
  StatusOr<PendingProcess> Fork(const ProcessSpec& spec, const std::string& hook);

  // A request sent and not answered yet; answers come in the order of the requests.
  struct Ticket {
    ProcessSpec spec;
    int go = -1;  // the write end of the pipe the worker waits on
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&&) = delete;
    ~Ticket();
  };
  StatusOr<Ticket> Request(const ProcessSpec& spec, const std::string& hook);
  // The answer to the oldest ticket not collected: the worker, adopted and in its cgroup.
  StatusOr<PendingProcess> Collect(Ticket& ticket);

 private:
  void Launch();
  void WaitForHello();
  void OnHello();
  void OnExit(ExitStatus status);
  // The template cannot be used any more: ended, and started again unless `off`.
  void Broken(const std::string& why, bool off);
  void Settle();
  Status Send(const ProcessSpec& spec, const std::string& hook, int go_fd);

  boost::asio::io_context& io_;
  WarmOptions options_;
  const WorkerCgroup* cgroup_;
  GroupGuard* guard_;
  ChildRegistry& children_;
  std::unique_ptr<AttemptCgroup> own_cgroup_;
  std::string source_;  // the template's file
  State state_ = State::kStarting;
  pid_t pid_ = -1;
  std::unique_ptr<boost::asio::posix::stream_descriptor> socket_;
  std::unique_ptr<ExitWatcher> watcher_;
  int failed_starts_ = 0;
  int unanswered_ = 0;       // requests sent to this template whose answers were not read
  bool first_start_ = true;  // no template has been ready or given up on yet
  std::vector<std::function<void()>> waiting_;
  boost::asio::steady_timer ready_deadline_;
};

}  // namespace crun::agent
