#include "agent/supervise/lifecycle.h"

#include <signal.h>

#include <algorithm>

namespace crun::agent::lifecycle {
namespace {

// One transition under way: the state it changes and the actions it asks for.
struct Step {
  State s;
  std::vector<Action> out;

  Transition Done() {
    Transition t{std::move(s), std::move(out), std::nullopt};
    t.wake_at = t.state.kill_at;
    return t;
  }
};

Transition Unchanged(State s) { return Step{std::move(s), {}}.Done(); }

Worker* Find(State& s, int local_rank) {
  const int i = local_rank - s.settings.first_local_rank;
  if (i < 0 || i >= static_cast<int>(s.workers.size())) return nullptr;
  return &s.workers[static_cast<std::size_t>(i)];
}

std::vector<int> RunningRanks(const State& s) {
  std::vector<int> ranks;
  for (const auto& w : s.workers) {
    if (w.state == Worker::State::kRunning) ranks.push_back(w.local_rank);
  }
  return ranks;
}

Failure* HangOf(State& s, int local_rank) {
  for (auto& f : s.failures) {
    if (f.local_rank == local_rank && f.hang) return &f;
  }
  return nullptr;
}

void End(Step& st, int exit_code, Finish::How how) {
  st.s.phase = Phase::kDone;
  st.s.exit_code = exit_code;
  st.s.kill_at.reset();
  st.out.push_back(Finish{exit_code, how});
}

void ReportFailures(Step& st) {
  if (st.s.failure_reported || st.s.failures.empty()) return;
  st.s.failure_reported = true;
  st.out.push_back(ReportFailure{st.s.attempt});
}

void Conclude(Step& st) {
  const Outcome o = st.s.outcome.value_or(Outcome{});
  End(st, o.success ? 0 : o.exit_code, Finish::How::kOutcome);
}

// No workers run: act on what the rendezvous decided, or wait for it.
void AfterWorkersDown(Step& st) {
  if (st.s.next == Next::kRejoin) {
    st.s.next = Next::kNone;
    st.s.failures.clear();
    st.out.push_back(Join{});
  } else if (st.s.next == Next::kConclude) {
    Conclude(st);
  }
}

// The attempt is over once every worker has exited, all their output has been read and its
// edge is clear.
void MaybeEndAttempt(Step& st) {
  State& s = st.s;
  if (s.phase != Phase::kRunning && s.phase != Phase::kStopping) return;
  if (!s.edge_clear || !RunningRanks(s).empty()) return;
  for (const auto& w : s.workers) {
    if (w.open_streams > 0) return;
  }
  st.out.push_back(EndAttempt{s.attempt});
  s.kill_at.reset();
  s.phase = Phase::kWaiting;
  if (s.stopped_by_signal != 0) return End(st, 128 + s.stopped_by_signal, Finish::How::kSignal);
  std::stable_sort(s.failures.begin(), s.failures.end(),
                   [](const Failure& a, const Failure& b) { return a.when < b.when; });
  if (s.edge_stuck && s.next != Next::kConclude) {
    // Another attempt beside processes of this one would share the GPUs, ports and files
    // they hold: the job ends here, with the failure that caused the restart if any.
    const int code = s.failures.empty() ? 1 : s.failures.front().exit.ShellCode();
    return End(st, code, Finish::How::kEdgeStuck);
  }
  if (s.failures.empty() && s.next == Next::kNone) st.out.push_back(ReportSuccess{});
  AfterWorkersDown(st);
}

// Every worker has exited: the edge ends and reaps the rest of the attempt.
void EdgeIfAllExited(Step& st) {
  State& s = st.s;
  if (s.edge_begun || (s.phase != Phase::kRunning && s.phase != Phase::kStopping)) return;
  if (!RunningRanks(s).empty()) return;
  s.edge_begun = true;
  st.out.push_back(BeginEdge{s.attempt});
}

void BeginStop(Step& st, int signo, TimePoint now) {
  State& s = st.s;
  if (s.phase == Phase::kStopping && signo == SIGTERM) return;  // already on its way down
  s.phase = Phase::kStopping;
  const std::vector<int> ranks = RunningRanks(s);
  if (ranks.empty()) return MaybeEndAttempt(st);
  st.out.push_back(SignalWorkers{s.attempt, signo, ranks, SignalWorkers::Why::kStop});
  s.kill_at = now + s.settings.shutdown_timeout;
}

std::string Workers(std::size_t n) { return std::to_string(n) + (n == 1 ? " worker" : " workers"); }

}  // namespace

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kWaiting:
      return "waiting";
    case Phase::kStarting:
      return "starting";
    case Phase::kRunning:
      return "running";
    case Phase::kStopping:
      return "stopping";
    case Phase::kDone:
      return "done";
  }
  return "?";
}

int Running(const State& state) { return static_cast<int>(RunningRanks(state).size()); }

bool IsLive(const State& s, int attempt) {
  return attempt == s.attempt && (s.phase == Phase::kRunning || s.phase == Phase::kStopping);
}

State Initial(const Settings& settings) {
  State s;
  s.settings = settings;
  return s;
}

Transition OnAssignment(State state, int round, bool spare, TimePoint /*now*/) {
  if (state.phase != Phase::kWaiting || state.stopped_by_signal != 0) {
    return Unchanged(std::move(state));
  }
  Step st{std::move(state), {}};
  State& s = st.s;
  if (spare) {
    st.out.push_back(WaitAsSpare{round});
    return st.Done();
  }
  ++s.attempt;
  s.phase = Phase::kStarting;
  s.next = Next::kNone;
  s.failures.clear();
  s.failure_reported = false;
  s.edge_begun = false;
  s.edge_clear = false;
  s.edge_stuck = false;
  s.kill_at.reset();
  s.workers.assign(static_cast<std::size_t>(std::max(0, s.settings.nproc)), Worker{});
  for (std::size_t i = 0; i < s.workers.size(); ++i) {
    s.workers[i].local_rank = s.settings.first_local_rank + static_cast<int>(i);
  }
  st.out.push_back(StartAttempt{s.attempt, round});
  return st.Done();
}

Transition OnLaunched(State state, int attempt, const std::vector<Launch>& launches,
                      TimePoint now) {
  if (attempt != state.attempt || state.phase != Phase::kStarting) {
    return Unchanged(std::move(state));
  }
  Step st{std::move(state), {}};
  State& s = st.s;
  s.phase = Phase::kRunning;
  bool failed = false;
  for (const auto& l : launches) {
    Worker* w = Find(s, l.local_rank);
    if (w == nullptr || w->state != Worker::State::kNotStarted) continue;
    w->open_streams = std::max(0, l.streams);
    if (l.started) {
      w->state = Worker::State::kRunning;
      continue;
    }
    w->state = Worker::State::kExited;
    s.failures.push_back(Failure{l.local_rank, ExitStatus{false, l.code}, now, false});
    failed = true;
  }
  ReportFailures(st);
  if (s.stopped_by_signal != 0) {
    BeginStop(st, s.stopped_by_signal, now);
  } else if (failed || s.next != Next::kNone) {
    BeginStop(st, SIGTERM, now);
  } else {
    st.out.push_back(AttemptStarted{attempt});
  }
  EdgeIfAllExited(st);
  MaybeEndAttempt(st);
  return st.Done();
}

Transition OnWorkerExit(State state, int attempt, int local_rank, ExitStatus exit, TimePoint now) {
  Worker* w = IsLive(state, attempt) ? Find(state, local_rank) : nullptr;
  if (w == nullptr || w->state != Worker::State::kRunning) return Unchanged(std::move(state));
  w->state = Worker::State::kExited;
  Step st{std::move(state), {}};
  State& s = st.s;
  WorkerExited e{attempt, local_rank, exit};
  e.stopping = s.phase == Phase::kStopping;
  if (Failure* hung = HangOf(s, local_rank)) {
    hung->exit = exit;  // stopped by crun after it hung: its record stands, with how it ended
    e.record = WorkerExited::Record::kHangEnd;
  } else if (!exit.success()) {
    s.failures.push_back(Failure{local_rank, exit, now, false});
    e.record = WorkerExited::Record::kFailure;
    e.stops_group = s.phase == Phase::kRunning;
  }
  st.out.push_back(e);
  if (e.stops_group) {
    ReportFailures(st);
    BeginStop(st, SIGTERM, now);
  }
  EdgeIfAllExited(st);
  MaybeEndAttempt(st);
  return st.Done();
}

Transition OnStreamClosed(State state, int attempt, int local_rank, TimePoint /*now*/) {
  Worker* w = IsLive(state, attempt) ? Find(state, local_rank) : nullptr;
  if (w == nullptr || w->open_streams == 0) return Unchanged(std::move(state));
  --w->open_streams;
  Step st{std::move(state), {}};
  MaybeEndAttempt(st);
  return st.Done();
}

Transition OnEdgeDone(State state, int attempt, bool complete, TimePoint /*now*/) {
  if (!IsLive(state, attempt) || !state.edge_begun || state.edge_clear) {
    return Unchanged(std::move(state));
  }
  Step st{std::move(state), {}};
  st.s.edge_clear = true;
  st.s.edge_stuck = !complete;
  MaybeEndAttempt(st);
  return st.Done();
}

Transition OnHang(State state, int attempt, const std::vector<int>& hung, TimePoint declared,
                  TimePoint now) {
  if (!IsLive(state, attempt)) return Unchanged(std::move(state));
  Step st{std::move(state), {}};
  State& s = st.s;
  for (int lr : hung) {
    Worker* w = Find(s, lr);
    if (w == nullptr || w->state != Worker::State::kRunning || HangOf(s, lr) != nullptr) continue;
    s.failures.push_back(Failure{lr, ExitStatus{true, SIGTERM}, declared, true});
    st.out.push_back(RecordHang{attempt, lr});
  }
  if (s.phase == Phase::kRunning) {  // else already stopping for another failure
    ReportFailures(st);
    BeginStop(st, SIGTERM, now);
  }
  return st.Done();
}

Transition OnStopAndRejoin(State state, bool spends_restart, TimePoint now) {
  if (state.phase == Phase::kDone || state.stopped_by_signal != 0 ||
      state.next == Next::kConclude) {
    return Unchanged(std::move(state));  // the job's end was decided already
  }
  Step st{std::move(state), {}};
  st.out.push_back(Restarting{spends_restart});
  st.s.next = Next::kRejoin;
  if (st.s.phase == Phase::kRunning) {
    BeginStop(st, SIGTERM, now);
  } else if (st.s.phase == Phase::kWaiting) {
    AfterWorkersDown(st);
  }  // kStarting: OnLaunched stops them; kStopping: on their way down
  return st.Done();
}

Transition OnFinished(State state, Outcome outcome, TimePoint now) {
  if (state.phase == Phase::kDone) return Unchanged(std::move(state));
  Step st{std::move(state), {}};
  st.s.outcome = outcome;
  st.s.next = Next::kConclude;
  if (st.s.phase == Phase::kRunning) {
    BeginStop(st, SIGTERM, now);
  } else if (st.s.phase == Phase::kWaiting) {
    AfterWorkersDown(st);
  }
  return st.Done();
}

Transition OnNodeLeaves(State state, NodeLeaves leaves, TimePoint now) {
  if (state.phase == Phase::kDone || state.node_left) return Unchanged(std::move(state));
  state.node_left = true;
  const int code = leaves.exit_code;
  Transition t = OnFinished(std::move(state), Outcome{false, code}, now);
  t.actions.insert(t.actions.begin(), LeaveJob{std::move(leaves)});
  return t;
}

Transition OnSignal(State state, int signo, TimePoint now) {
  if (state.phase == Phase::kDone) return Unchanged(std::move(state));
  Step st{std::move(state), {}};
  State& s = st.s;
  const std::vector<int> ranks = RunningRanks(s);
  const std::string name = SignalName(signo);
  if (signo == SIGUSR1 || signo == SIGUSR2) {
    // A notice, not a stop: the workers decide what it means.
    st.out.push_back(
        Say{Say::Level::kWarn, "received " + name + ": passing it on to " + Workers(ranks.size())});
    if (!ranks.empty()) {
      st.out.push_back(SignalWorkers{s.attempt, signo, ranks, SignalWorkers::Why::kNotice});
    }
    return st.Done();
  }
  if (s.stopped_by_signal != 0) {
    // Already stopping. A second Ctrl-C (or SIGQUIT) is someone at a terminal who will not
    // wait: no more grace. A repeated SIGTERM or SIGHUP is not: Slurm, for one, sends
    // SIGTERM more than once at a job's time limit, and the grace stands.
    if (signo != SIGINT && signo != SIGQUIT) {
      st.out.push_back(Say{Say::Level::kWarn,
                           "received " + name + " again: the workers keep their grace period"});
      return st.Done();
    }
    st.out.push_back(
        Say{Say::Level::kWarn, "received " + name + " again: SIGKILL to the workers now"});
    if (!ranks.empty()) {
      st.out.push_back(SignalWorkers{s.attempt, SIGKILL, ranks, SignalWorkers::Why::kNoMoreGrace});
    }
    return st.Done();
  }
  s.stopped_by_signal = signo;
  st.out.push_back(
      Say{Say::Level::kWarn, "received " + name + ": forwarding it to " + Workers(ranks.size())});
  st.out.push_back(Leave{signo});
  if (s.phase == Phase::kWaiting) {
    End(st, 128 + signo, Finish::How::kSignalWaiting);
  } else if (s.phase != Phase::kStarting) {  // kStarting: OnLaunched stops them
    s.phase = Phase::kRunning;               // so that the signal itself is forwarded
    BeginStop(st, signo, now);
  }
  return st.Done();
}

Transition OnTick(State state, TimePoint now) {
  if (state.phase != Phase::kStopping || !state.kill_at || now < *state.kill_at) {
    return Unchanged(std::move(state));
  }
  Step st{std::move(state), {}};
  st.s.kill_at.reset();
  const std::vector<int> ranks = RunningRanks(st.s);
  if (!ranks.empty()) {
    st.out.push_back(SignalWorkers{st.s.attempt, SIGKILL, ranks, SignalWorkers::Why::kGraceOver});
  }
  return st.Done();
}

}  // namespace crun::agent::lifecycle
