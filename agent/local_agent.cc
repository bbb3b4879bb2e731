#include "agent/local_agent.h"

#include <signal.h>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

namespace crun::agent {
namespace {

namespace asio = boost::asio;

std::string Substitute(std::string arg, int local_rank) {
  static const std::string kMacro = "${local_rank}";
  for (auto at = arg.find(kMacro); at != std::string::npos; at = arg.find(kMacro, at)) {
    const std::string value = std::to_string(local_rank);
    arg.replace(at, kMacro.size(), value);
    at += value.size();
  }
  return arg;
}

// The shell's codes for a program that cannot be run.
int LaunchFailureCode(const Status& s) {
  if (s.message().find("No such file") != std::string::npos) return 127;
  if (s.message().find("Permission denied") != std::string::npos) return 126;
  return 1;
}

}  // namespace

struct LocalAgent::Impl {
  struct Worker {
    int local_rank = 0;
    pid_t pid = 0;
    bool running = false;
    std::unique_ptr<ExitWatcher> watcher;
  };
  enum class Phase { kRunning, kStopping, kDone };

  Impl(asio::io_context& io_, AgentOptions o, std::unique_ptr<Rendezvous> r)
      : io(io_), options(std::move(o)), rdzv(std::move(r)), signals(io_), kill_timer(io_) {
    if (options.forward_signals.empty()) options.forward_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  }

  int Run() {
    auto g = GroupGuard::Start();
    if (!g.ok()) {
      spdlog::error("{}", g.status().message());
      return 1;
    }
    guard = std::move(g).value();
    for (int s : options.forward_signals) signals.add(s);
    ArmSignals();
    StartAttempt();
    io.run();
    return exit_code;
  }

  void ArmSignals() {
    signals.async_wait([this](const boost::system::error_code& ec, int signo) {
      if (ec) return;
      OnSignal(signo);
      if (phase != Phase::kDone) ArmSignals();
    });
  }

  void StartAttempt() {
    phase = Phase::kRunning;
    failures.clear();
    auto assignment = rdzv->NextRound(attempt);
    if (!assignment.ok()) {
      spdlog::error("rendezvous for attempt {} failed: {}", attempt, assignment.status().message());
      exit_code = 1;
      return Finish();
    }
    group = std::move(assignment).value();
    const Environment base = CurrentEnvironment();
    workers.clear();
    workers.resize(static_cast<std::size_t>(options.nproc));
    for (int lr = 0; lr < options.nproc; ++lr) {
      ProcessSpec spec;
      for (const auto& a : options.command) spec.argv.push_back(Substitute(a, lr));
      spec.envp = ToEnvp(BuildWorkerEnvironment(group, lr, "", "", base));
      auto pid = SpawnProcess(spec);
      if (!pid.ok()) {
        spdlog::error("local rank {}: {}", lr, pid.status().message());
        launch_error = LaunchFailureCode(pid.status());
        failed_to_launch = true;
        if (running == 0) return Finish(launch_error);
        return BeginStop(SIGTERM);
      }
      auto& w = workers[static_cast<std::size_t>(lr)];
      w.local_rank = lr;
      w.pid = *pid;
      w.running = true;
      ++running;
      guard->Add(w.pid);
      auto watcher = ExitWatcher::Watch(io, w.pid, [this, lr](ExitStatus s) { OnExit(lr, s); });
      if (!watcher.ok()) {
        spdlog::error("{}", watcher.status().message());
        ::kill(-w.pid, SIGKILL);  // unwatched, it would be lost: take it down now
      } else {
        w.watcher = std::move(watcher).value();
      }
    }
    spdlog::info("attempt {}: started {} workers (store {}:{})", attempt, options.nproc,
                 group.master_addr, group.master_port);
  }

  void OnExit(int lr, ExitStatus status) {
    auto& w = workers[static_cast<std::size_t>(lr)];
    w.running = false;
    --running;
    if (!status.success()) {
      failures.push_back({group.base_rank + lr, lr, w.pid, status, std::chrono::system_clock::now()});
      if (phase == Phase::kRunning) {
        spdlog::warn("rank {} (local rank {}, pid {}) on {} failed with {}; stopping the other "
                     "workers",
                     group.base_rank + lr, lr, w.pid, options.host_name, status.Describe());
        BeginStop(SIGTERM);
      }
    }
    if (running == 0) OnAllExited();
  }

  void BeginStop(int signo) {
    phase = Phase::kStopping;
    for (const auto& w : workers) {
      if (w.running) ::kill(-w.pid, signo);
    }
    kill_timer.expires_after(options.shutdown_timeout);
    kill_timer.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      for (const auto& w : workers) {
        if (w.running) {
          spdlog::warn("local rank {} (pid {}) still running {} ms after the stop signal: "
                       "SIGKILL",
                       w.local_rank, w.pid, options.shutdown_timeout.count());
          ::kill(-w.pid, SIGKILL);
        }
      }
    });
  }

  void OnSignal(int signo) {
    if (phase == Phase::kDone) return;
    if (stopped_by_signal != 0) {
      // A second signal: no more grace.
      for (const auto& w : workers) {
        if (w.running) ::kill(-w.pid, SIGKILL);
      }
      return;
    }
    stopped_by_signal = signo;
    spdlog::warn("received {}: forwarding it to {} workers", SignalName(signo), running);
    if (running == 0) return Finish(128 + signo);
    BeginStop(signo);
  }

  void OnAllExited() {
    kill_timer.cancel();
    // Whatever the workers left behind in their groups goes with them.
    for (const auto& w : workers) {
      if (w.pid > 0) {
        ::kill(-w.pid, SIGKILL);
        guard->Forget(w.pid);
      }
    }
    if (stopped_by_signal != 0) return Finish(128 + stopped_by_signal);
    if (failed_to_launch) return Finish(launch_error);
    if (failures.empty()) return Finish(0);
    const WorkerFailure& root = *std::min_element(
        failures.begin(), failures.end(),
        [](const auto& a, const auto& b) { return a.when < b.when; });
    if (attempt < options.max_restarts) {
      ++attempt;
      spdlog::warn("restarting the worker group: attempt {} of at most {} (root cause: rank {} "
                   "{})",
                   attempt, options.max_restarts, root.rank, root.exit.Describe());
      // Not from inside this exit callback: starting replaces the watchers, this one included.
      asio::post(io, [this] { StartAttempt(); });
      return;
    }
    spdlog::error("job failed: rank {} (local rank {}, pid {}) on {} exited with {}{}", root.rank,
                  root.local_rank, root.pid, options.host_name, root.exit.Describe(),
                  options.max_restarts > 0
                      ? " after " + std::to_string(options.max_restarts) + " restarts"
                      : std::string());
    Finish(root.exit.ShellCode());
  }

  void Finish(int code = -1) {
    if (code >= 0) exit_code = code;
    phase = Phase::kDone;
    boost::system::error_code ec;
    signals.cancel(ec);
    kill_timer.cancel();
    rdzv->Shutdown();
  }

  asio::io_context& io;
  AgentOptions options;
  std::unique_ptr<Rendezvous> rdzv;
  std::unique_ptr<GroupGuard> guard;
  asio::signal_set signals;
  asio::steady_timer kill_timer;
  std::vector<Worker> workers;
  std::vector<WorkerFailure> failures;
  GroupAssignment group;
  Phase phase = Phase::kRunning;
  int running = 0;
  int attempt = 0;
  int stopped_by_signal = 0;
  bool failed_to_launch = false;
  int launch_error = 0;
  int exit_code = 0;
};

LocalAgent::LocalAgent(asio::io_context& io, AgentOptions options,
                       std::unique_ptr<Rendezvous> rendezvous)
    : impl_(std::make_unique<Impl>(io, std::move(options), std::move(rendezvous))) {}

LocalAgent::~LocalAgent() = default;

int LocalAgent::Run() { return impl_->Run(); }

}  // namespace crun::agent
