#include "agent/workers/attempt_start.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include <spdlog/spdlog.h>

#include "agent/frameworks/contracts.h"
#include "agent/hangs/python_hook.h"

namespace crun::agent {
namespace {

std::string Substitute(std::string arg, int local_rank) {
  static const std::string kMacro = "${local_rank}";
  for (auto at = arg.find(kMacro); at != std::string::npos; at = arg.find(kMacro, at)) {
    const std::string value = std::to_string(local_rank);
    arg.replace(at, kMacro.size(), value);
    at += value.size();
  }
  return arg;
}

// The shell's codes for a program that cannot be run: 127 not found, 126 found but not
// executable (or exec failed otherwise).
int LaunchFailureCode(const Status& s) { return s.code() == StatusCode::kNotFound ? 127 : 126; }

WorkerStart Failed(int lr, int code, std::string why, int streams) {
  spdlog::error("local rank {}: {}", lr, why);
  return WorkerStart{lifecycle::Launch{lr, false, code, streams}, std::move(why)};
}

int StreamsOf(const Worker& w) { return (w.out_pump ? 1 : 0) + (w.err_pump ? 1 : 0); }

// The heartbeat pipe, the stack pipe, the hook on PYTHONPATH and the timer file.
void AddChannels(boost::asio::io_context& io, const AttemptStartContext& c, Worker& w,
                 Environment& env, ProcessSpec& spec) {
  HangChannels h;
  if (c.progress != nullptr) {
    // Beats count as the worker's progress (hangs) and the job's; step records are beats too.
    auto parser = std::make_shared<HeartbeatParser>();
    auto pipe = WorkerPipe::Create(io, [counter = w.progress, progress = c.progress, parser,
                                        local_rank = w.local_rank](std::string_view bytes) {
      std::vector<StepRecord> records;
      const int beats = parser->Feed(bytes, records);  // a record's tail alone beat with its 'S'
      if (beats > 0) ++*counter;
      progress->Heard(local_rank, beats, records);
    });
    if (pipe.ok()) {
      w.heartbeat = std::move(pipe).value();
      h.heartbeat_fd = w.heartbeat->child_fd();
      spec.inherit_fds.push_back(h.heartbeat_fd);
    } else {
      spdlog::warn("local rank {}: no heartbeat: {}", w.local_rank, pipe.status().message());
    }
  }
  if (auto pipe = StackPipe::Create(io); pipe.ok()) {
    w.stacks = std::move(pipe).value();
    h.stacks_fd = w.stacks->child_fd();
    h.stacks_safe_signal = HookSignals().safe;
    h.stacks_signal = HookSignals().at_once;
    spec.inherit_fds.push_back(h.stacks_fd);
  }
  h.python_dir = c.python_dir;
  h.python_sdk_dir = c.python_sdk_dir;
  h.timer_file = c.timer_file;
  AddHangChannels(h, env);
}

// The worker's process: what it runs, where, with which environment and streams.
StatusOr<ProcessSpec> SpecOf(boost::asio::io_context& io, const AgentOptions& o,
                             const AttemptStartContext& c, WorkerStreams& streams, Worker& w,
                             std::vector<int>* child_fds) {
  const int lr = w.local_rank;
  ProcessSpec spec;
  spec.cgroup_fd = c.cgroup_fd;
  spec.cgroup_dir = c.cgroup_dir;
  if (const auto i = static_cast<std::size_t>(lr - o.first_local_rank); i < o.bindings.size()) {
    spec.cpus = o.bindings[i].cpus;
    spec.mem_nodes = o.bindings[i].mems;
  }
  for (const auto& a : o.command) spec.argv.push_back(Substitute(a, lr));
  Environment env = BuildWorkerEnvironment(c.group, lr, w.error_file, w.dir, c.base);
  if (Status s = AddContractEnvironment(o.contracts, c.group, lr, env); !s.ok()) return s;
  w.progress = std::make_shared<std::uint64_t>(0);
  AddChannels(io, c, w, env, spec);
  spec.envp = ToEnvp(env);
  const StreamOwner owner{c.group.role, c.group.base_rank + lr, lr, w.dir};
  auto closed = [on = c.on_stream_closed, lr] { on(lr); };
  w.out_pump = streams.Route(owner, 1, &spec.stdout_fd, child_fds, closed, w.progress);
  w.err_pump = streams.Route(owner, 2, &spec.stderr_fd, child_fds, closed, w.progress);
  return spec;
}

// One rank on its way: its spec, the descriptors its child gets (closed in crun once it has
// them), and its process, or the template's ticket for it (a warm start asked for).
struct Starting {
  Worker* w = nullptr;
  ProcessSpec spec;
  std::vector<int> child_fds;
  std::optional<WarmTemplate::Ticket> ticket;
  std::optional<PendingProcess> pending;
};

std::optional<WorkerStart> Adopt(const AttemptStartContext& c, Starting& s);

std::string HookOf(const AttemptStartContext& c) {
  return c.python_dir.empty() ? "" : c.python_dir + "/sitecustomize.py";
}

// Phase one for one rank: its directory, its spec, and a warm request when the template is
// ready, else its fork (the child waits to exec).
std::optional<WorkerStart> Prepare(boost::asio::io_context& io, const AgentOptions& o,
                                   const AttemptStartContext& c, WorkerStreams& streams,
                                   const std::string& attempt_dir, Starting& s) {
  Worker& w = *s.w;
  std::error_code ec;
  std::filesystem::create_directories(w.dir, ec);
  if (ec)
    return Failed(w.local_rank, 1, "cannot create log directory " + w.dir + ": " + ec.message(), 0);
  if (w.local_rank == o.first_local_rank) streams.BeginAttempt(attempt_dir);
  w.error_file = w.dir + "/error.json";
  std::filesystem::remove(w.error_file, ec);  // a re-formed round with the same number
  auto spec = SpecOf(io, o, c, streams, w, &s.child_fds);
  if (!spec.ok()) return Failed(w.local_rank, 1, spec.status().message(), 0);
  s.spec = std::move(spec).value();
  if (c.warm != nullptr && c.warm->state() == WarmTemplate::State::kReady) {
    auto ticket = c.warm->Request(s.spec, HookOf(c));
    if (ticket.ok()) {
      s.ticket.emplace(std::move(ticket).value());
      return std::nullopt;  // its fork is collected with the others' (Adopt)
    }
    spdlog::warn("local rank {}: {}; it starts cold", w.local_rank, ticket.status().message());
  }
  return Adopt(c, s);
}

// Phase one and a half: the warm fork asked for collected (or, when the template could not
// fork it, a cold start), then the child's descriptors closed in crun.
std::optional<WorkerStart> Adopt(const AttemptStartContext& c, Starting& s) {
  Worker& w = *s.w;
  StatusOr<PendingProcess> started = Aborted("not started");
  if (s.ticket) {
    started = c.warm->Collect(*s.ticket);
    s.ticket.reset();
    if (!started.ok()) {
      spdlog::warn("local rank {}: {}; it starts cold", w.local_rank, started.status().message());
    }
  }
  if (!started.ok()) started = StartProcess(s.spec, *c.children);
  for (int fd : s.child_fds) ::close(fd);
  s.child_fds.clear();
  if (w.heartbeat) w.heartbeat->CloseChildEnd();
  if (w.stacks) w.stacks->CloseChildEnd();
  if (!started.ok()) {
    return Failed(w.local_rank, LaunchFailureCode(started.status()), started.status().message(),
                  StreamsOf(w));
  }
  s.pending = std::move(started).value();
  return std::nullopt;
}

// A rank prepared but not to be started: its process ended and reaped, its descriptors closed.
void Abandon(const AttemptStartContext& c, Starting& s) {
  if (s.ticket) {
    if (auto p = c.warm->Collect(*s.ticket); p.ok()) s.pending = std::move(p).value();
    s.ticket.reset();
  }
  if (s.pending) {
    ::close(s.pending->report_fd);
    KillAndReap(s.pending->pid, *c.children);
    s.pending.reset();
  }
  for (int fd : s.child_fds) ::close(fd);
  s.child_fds.clear();
  if (s.w->heartbeat) s.w->heartbeat->CloseChildEnd();
  if (s.w->stacks) s.w->stacks->CloseChildEnd();
}

// Phase two for one rank: its exec confirmed, its exit watched.
WorkerStart Confirm(boost::asio::io_context& io, const AttemptStartContext& c, Worker& w,
                    PendingProcess& p) {
  auto pid = FinishStart(p);
  if (!pid.ok()) {
    return Failed(w.local_rank, LaunchFailureCode(pid.status()), pid.status().message(),
                  StreamsOf(w));
  }
  auto watcher =
      ExitWatcher::Watch(io, *pid, *c.children,
                         [on = c.on_exit, lr = w.local_rank](ExitStatus s) { on(lr, s); });
  if (!watcher.ok()) {
    // Unwatched, its end would never be seen: take it down and reap it now (SIGKILL cannot be
    // ignored, so the wait is short), and count it as not started.
    KillAndReap(*pid, *c.children);
    return Failed(w.local_rank, 1, watcher.status().message(), StreamsOf(w));
  }
  w.pid = *pid;
  w.running = true;
  w.watcher = std::move(watcher).value();
  return WorkerStart{lifecycle::Launch{w.local_rank, true, 0, StreamsOf(w)}, ""};
}

}  // namespace

std::vector<WorkerStart> StartWorkers(boost::asio::io_context& io, const AgentOptions& o,
                                      const AttemptStartContext& c, WorkerStreams& streams,
                                      std::vector<Worker>& workers) {
  workers.clear();
  workers.resize(static_cast<std::size_t>(o.nproc));
  const std::string attempt_dir = o.log_dir + "/attempt_" + std::to_string(c.group.round);
  std::vector<WorkerStart> result;
  std::vector<Starting> starting;
  starting.reserve(workers.size());
  for (int i = 0; i < o.nproc; ++i) {
    Worker& w = workers[static_cast<std::size_t>(i)];
    w.local_rank = o.first_local_rank + i;
    w.dir = attempt_dir + "/" + std::to_string(w.local_rank);
    starting.push_back(Starting{&w, {}, {}, {}, {}});
    if (auto failed = Prepare(io, o, c, streams, attempt_dir, starting.back())) {
      result.push_back(std::move(*failed));
      starting.pop_back();
      break;  // the ranks after it are not tried
    }
  }
  // The warm forks asked for, in order (the template forked them at the same time).
  for (std::size_t i = 0; i < starting.size(); ++i) {
    if (!starting[i].ticket) continue;
    if (auto failed = Adopt(c, starting[i])) {
      result.push_back(std::move(*failed));
      // The ranks after it are not started: their processes are ended (a warm one never
      // runs without its `go`) and their descriptors closed.
      for (std::size_t j = i + 1; j < starting.size(); ++j) Abandon(c, starting[j]);
      starting.resize(i);
      break;
    }
  }
  // Second phase: every child execs in parallel; collect the reports.
  for (auto& s : starting) {
    if (s.pending) result.push_back(Confirm(io, c, *s.w, *s.pending));
  }
  return result;
}

}  // namespace crun::agent
