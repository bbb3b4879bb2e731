// The agent's lifecycle: one node's workers through attempts, as pure functions of (state,
// event, now) that return the next state and the actions to take. No processes, signals,
// clocks or I/O: LocalAgent feeds it events and carries out its actions; tests drive it with
// tables and random orders of events and invented times (docs/reliability.md).
//
// An attempt: the rendezvous assigns a round, the workers start (StartAttempt), run, and end;
// a failure stops the others (the stop signal, then SIGKILL once the grace is over). Once every
// worker has exited, the attempt's edge ends and reaps whatever else it left (BeginEdge); the
// attempt is over when the edge is clear and every worker's output has been read (EndAttempt).
// Only then does anything else happen: the next join, the job's end, crun's exit.
//
// Every event about workers names its attempt. An event of an earlier attempt (a late exit, a
// stream closing, an edge) changes nothing and asks for nothing: it can never touch the
// current attempt.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "agent/supervise/exit_status.h"

namespace crun::agent::lifecycle {

using TimePoint = std::chrono::steady_clock::time_point;
using Millis = std::chrono::milliseconds;

struct Settings {
  int first_local_rank = 0;
  int nproc = 1;
  Millis shutdown_timeout{30'000};  // the stop signal's grace before SIGKILL
};

// kWaiting: no workers (joined, or about to; or a spare). kStarting: StartAttempt was asked
// for and its result (OnLaunched) has not come. kRunning: workers run. kStopping: they are being
// stopped. kDone: the job ended (Finish); nothing follows.
enum class Phase { kWaiting, kStarting, kRunning, kStopping, kDone };
const char* PhaseName(Phase p);

// What to do once the workers are down: nothing decided, join again, or end the job.
enum class Next { kNone, kRejoin, kConclude };

struct Worker {
  enum class State { kNotStarted, kRunning, kExited };
  int local_rank = 0;
  State state = State::kNotStarted;
  int open_streams = 0;  // its stdout/stderr pipes crun still reads
};

// A failure of this attempt, as far as deciding goes; LocalAgent keeps the full record.
struct Failure {
  int local_rank = 0;
  ExitStatus exit;
  TimePoint when;     // the first in time is the root cause
  bool hang = false;  // crun declared it failed, hung or slow (its exit, once stopped, follows)
};

// The rendezvous's word on the job.
struct Outcome {
  bool success = false;
  int exit_code = 0;
};

struct State {
  Settings settings;
  Phase phase = Phase::kWaiting;
  int attempt = -1;             // the current (or last) attempt, numbered from 0 in this crun
  std::vector<Worker> workers;  // index: local rank - first_local_rank
  std::vector<Failure> failures;
  bool failure_reported = false;  // this attempt's failures went to the rendezvous
  // The edge: begun once every worker exited; clear once all it started was reaped; stuck when
  // something outlived SIGKILL past its deadline (no attempt may start beside it).
  bool edge_begun = false, edge_clear = true, edge_stuck = false;
  Next next = Next::kNone;
  std::optional<Outcome> outcome;
  int stopped_by_signal = 0;         // the signal that stops the job, once one has
  bool node_left = false;            // this node left the job (OnNodeLeaves)
  std::optional<TimePoint> kill_at;  // the end of the stop's grace
  int exit_code = 0;                 // once done
};

// ---- actions: what LocalAgent carries out ---------------------------------------------------

// Start attempt `attempt` of round `round`, and answer with OnLaunched.
struct StartAttempt {
  int attempt = 0;
  int round = 0;
};
// This node is a spare of round `round`: it waits.
struct WaitAsSpare {
  int round = 0;
};
// The attempt's workers all started.
struct AttemptStarted {
  int attempt = 0;
};
// A worker exited. `record`: whether it is a failure to record (kFailure), the end of a hung
// worker whose record exists (kHangEnd), or neither. `stops_group`: this failure stops the
// others (the first while running). `stopping`: it exited while the group was being stopped.
struct WorkerExited {
  enum class Record { kNone, kFailure, kHangEnd };
  int attempt = 0;
  int local_rank = 0;
  ExitStatus exit;
  Record record = Record::kNone;
  bool stops_group = false;
  bool stopping = false;
};
// Record local rank `local_rank` as hung: it is stopped with the others.
struct RecordHang {
  int attempt = 0;
  int local_rank = 0;
};
// Send this attempt's failures to the rendezvous (the first of them, once).
struct ReportFailure {
  int attempt = 0;
};
// Signal the process groups of these running workers. kStop: the stop signal (a stopped
// process gets SIGCONT so that it acts on it; the hang watch stops). kNotice: passed on
// (SIGUSR1/2). kGraceOver: SIGKILL at the end of the grace. kNoMoreGrace: SIGKILL on a second
// Ctrl-C.
struct SignalWorkers {
  enum class Why { kStop, kNotice, kGraceOver, kNoMoreGrace };
  int attempt = 0;
  int signo = 0;
  std::vector<int> local_ranks;
  Why why = Why::kStop;
};
// Every worker exited: end and reap all else the attempt left, and answer with OnEdgeDone.
struct BeginEdge {
  int attempt = 0;
};
// The attempt is over: its streams, watches and guard entries end.
struct EndAttempt {
  int attempt = 0;
};
// The workers are to stop and the node to join again (spends_restart: after a failure).
struct Restarting {
  bool spends_restart = false;
};
struct ReportSuccess {};
// Join the rendezvous for the next round.
struct Join {};
// Leave the rendezvous: `signo` stops the job.
struct Leave {
  int signo = 0;
};
// This node leaves the job, to be requeued without it (docs/health.md). kUnhealthy: it failed
// its health check and does not join; kExcluded: it leaves the running job (a slow node).
struct NodeLeaves {
  enum class Why { kUnhealthy, kExcluded };
  Why why = Why::kExcluded;
  std::string detail;  // what was found: the health verdict, or why the node is slow
  int exit_code = 0;   // the job's on this node: "requeue without this node"
};
// Tell the rendezvous that this node leaves (unhealthy: it never joined), note the host in
// --unhealthy-nodes-file, and take `leaves` as the job's outcome here.
struct LeaveJob {
  NodeLeaves leaves;
};
// A line for the log.
struct Say {
  enum class Level { kInfo, kWarn };
  Level level = Level::kWarn;
  std::string text;
};
// The job ends with `exit_code`. kSignal: a signal stopped the workers (how each ended is
// told); kSignalWaiting: a signal came while no worker ran; kEdgeStuck: something of the attempt
// outlived SIGKILL (this node's failures are reported); kOutcome: the rendezvous decided (its
// report is printed).
struct Finish {
  enum class How { kSignal, kSignalWaiting, kEdgeStuck, kOutcome };
  int exit_code = 0;
  How how = How::kOutcome;
};

using Action = std::variant<StartAttempt, WaitAsSpare, AttemptStarted, WorkerExited, RecordHang,
                            ReportFailure, SignalWorkers, BeginEdge, EndAttempt, Restarting,
                            ReportSuccess, Join, Leave, LeaveJob, Say, Finish>;

struct Transition {
  State state;
  std::vector<Action> actions;
  // When OnTick must be called (the end of the stop's grace); nullopt: no tick is needed.
  std::optional<TimePoint> wake_at;
};

// ---- events ----------------------------------------------------------------------------------

State Initial(const Settings& settings);

// The rendezvous formed round `round`; `spare`: this node waits outside it.
Transition OnAssignment(State state, int round, bool spare, TimePoint now);
// StartAttempt's answer: how each local rank's start went. A rank absent from `launches` was
// never tried (an earlier one could not be prepared).
struct Launch {
  int local_rank = 0;
  bool started = false;
  int code = 0;     // when not started: the shell's code (127 not found, 126 cannot run)
  int streams = 0;  // pipes crun reads from it (made before its start, so also when it failed)
};
Transition OnLaunched(State state, int attempt, const std::vector<Launch>& launches, TimePoint now);
Transition OnWorkerExit(State state, int attempt, int local_rank, ExitStatus exit, TimePoint now);
// One of a worker's streams reached its end (every writer gone) and was read to it.
Transition OnStreamClosed(State state, int attempt, int local_rank, TimePoint now);
// The attempt's edge is over; `complete`: nothing of the attempt is left.
Transition OnEdgeDone(State state, int attempt, bool complete, TimePoint now);
// crun declared `hung` local ranks failed at `declared`: hung (and every rank's stacks read
// since), or slow (--straggler-action restart). They are stopped with the others and reported.
Transition OnHang(State state, int attempt, const std::vector<int>& hung, TimePoint declared,
                  TimePoint now);
// The rendezvous: stop the workers and join again.
Transition OnStopAndRejoin(State state, bool spends_restart, TimePoint now);
// The rendezvous: the job is over.
Transition OnFinished(State state, Outcome outcome, TimePoint now);
// This node leaves the job (LeaveJob), and the job ends here as the rendezvous's end does:
// the workers stop, then Finish with `leaves.exit_code`. Once: a second changes nothing.
Transition OnNodeLeaves(State state, NodeLeaves leaves, TimePoint now);
// crun received `signo` (a forwarded signal: SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1/2).
Transition OnSignal(State state, int signo, TimePoint now);
Transition OnTick(State state, TimePoint now);

// How many workers of the current attempt run.
int Running(const State& state);
// Whether events about workers of `attempt` are about the current attempt's live workers
// (running, or being stopped); any other such event changes nothing.
bool IsLive(const State& state, int attempt);

}  // namespace crun::agent::lifecycle
