// Stacks of running workers, for hangs and `crun stacks` (docs/hangs.md): read without
// stopping the job, parsed into threads and frames, and summarised by grouping ranks that wait
// in the same place ("rank 5: in `load_batch` <- `train_step`; ranks 0-4,6-7: in `all_reduce`").
//
// How a worker's stacks are read, best first:
// * Python: py-spy (`py-spy dump`, when installed: crun's PATH or beside the workers'
//   interpreter); else the hook crun installs in every Python worker (a sitecustomize writing
//   faulthandler's dump to a pipe crun reads: StackPipe), on one of two real-time signals.
// * Native (and Python where neither works): eu-stack (elfutils), else gdb.
// The tools run as crun's children; workers name crun as their tracer (process.h), so this
// works where Yama allows tracing only by ancestors.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "agent/hangs/worker_pipe.h"
#include "base/status.h"

namespace crun::agent {

struct Frame {
  std::string function;  // "train_step", "gloo::transport::tcp::UnboundBuffer::waitRecv"
  std::string file;      // "train.py", "/usr/lib/python3.11/threading.py"; may be empty
  int line = 0;          // 0: unknown
};

struct ThreadStack {
  std::string title;          // as the tool names it: "Thread 1234 (idle): \"MainThread\""
  bool main = false;          // the process's main thread
  std::vector<Frame> frames;  // innermost first
};

// Parsers of each tool's text; threads in the tool's order, exactly one marked main when
// any thread was found.
std::vector<ThreadStack> ParsePySpy(const std::string& text);
std::vector<ThreadStack> ParseFaulthandler(const std::string& text);
std::vector<ThreadStack> ParseEuStack(const std::string& text, pid_t pid);
std::vector<ThreadStack> ParseGdb(const std::string& text, pid_t pid);

// One rank's stacks.
struct RankStacks {
  std::string host;
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  // "py-spy", "faulthandler" (crun's hook, at a safe point), "faulthandler (signal handler)"
  // (the hook, at once), "eu-stack", "gdb"; empty when none worked
  std::string tool;
  std::string text;  // the tool's output
  std::vector<ThreadStack> threads;
  std::string error;  // why there is no stack (every method tried), when none
};

// Other nodes' stacks (read through the rendezvous service): every rank, and each node that
// gave none with why ("node-c (no answer in time)", "node-b: no workers running").
struct RemoteStacks {
  std::vector<RankStacks> ranks;
  std::vector<std::string> missing;
};

// Where the main thread is: "in `hang_here` <- `main` <- `<module>`", from its innermost
// frames, skipping the C library's wait primitives; ranks with the same place are one group.
std::string WhereWaiting(const RankStacks& stacks);
// "0-4,6-7"
std::string RankRanges(std::vector<int> ranks);
// One line per group: groups holding a rank of `first` (the hung ones) first, then the smallest
// group (the odd one out):
//   "rank 5: in `load_batch` <- `train_step`"
//   "ranks 0-4,6-7: in `all_reduce` <- `wrapper` <- `train_step`"
std::vector<std::string> GroupSummary(const std::vector<RankStacks>& ranks,
                                      const std::set<int>& first = {});
// The grouped summary, then full stacks: every rank's up to 8 ranks; beyond, those of the
// ranks in `always` and of the first rank of each group, the rest named as "the same places".
std::string FormatStacks(const std::vector<RankStacks>& ranks, const std::set<int>& always);
// Which ranks look like the cause of a hang, from where they are: those whose main thread is
// not in a collective (all_reduce, barrier, ... in torch.distributed, Gloo or NCCL) while others
// are; else the one smallest group, when one group is smaller than all others; else every
// rank. Ranks whose stacks could not be read are never suspects on their stacks alone.
std::set<int> SuspectRanks(const std::vector<RankStacks>& ranks);
// One rank's full stacks, as text: its header line, then each thread.
std::string FormatRankStacks(const RankStacks& stacks);
nlohmann::json StacksJson(const RankStacks& stacks);
RankStacks StacksFromJson(const nlohmann::json& j);

// The read end of one worker's CRUN_STACKS_FD (the Python hook's pipe). Owned by the agent for
// the worker's life; it reads all the time, so that the worker never blocks writing.
class StackPipe {
 public:
  static StatusOr<std::unique_ptr<StackPipe>> Create(boost::asio::io_context& io);
  // A request still open ends with what came (its worker is gone).
  ~StackPipe();
  // The write end, for the worker (ProcessSpec::inherit_fds); crun closes it once started.
  int child_fd() const { return pipe_->child_fd(); }
  void CloseChildEnd() { pipe_->CloseChildEnd(); }
  // Asks the hook in `pid` for its stacks and collects what it writes. First the safe signal
  // (when `pid` catches it): the hook answers at the main thread's next safe point, between
  // two bytecodes, with the dump between two marker lines; complete at the end marker. With
  // no answer within `safe_wait` the main thread is blocked in C code (a collective, a lock):
  // then the at-once signal, answered from the signal handler; complete once nothing more
  // came for `quiet` after the first bytes, or at `deadline`. `done(text, at_once)`: the
  // dump (empty when nothing came), and whether it was the at-once one.
  struct Timing {
    std::chrono::milliseconds safe_wait{100}, quiet{100}, deadline{3000};
  };
  void Request(pid_t pid, Timing timing, std::function<void(std::string, bool)> done);

 private:
  explicit StackPipe(boost::asio::io_context& io);
  void OnData(std::string_view data);
  void AskAtOnce();
  void Finish();
  std::unique_ptr<WorkerPipe> pipe_;
  boost::asio::steady_timer step_timer_, deadline_timer_;
  pid_t pid_ = 0;
  bool at_once_ = false;  // the at-once signal was sent
  std::chrono::milliseconds quiet_{};
  std::string buffer_;
  std::function<void(std::string, bool)> done_;
};

// The two real-time signals the Python hook answers (nothing else of crun's uses them).
// faulthandler's dump from the signal handler reads the interpreter's frames while they may
// be changing (a worker busy in Python code): "best effort", and it has crashed workers that
// were importing torch. The safe one runs faulthandler from a Python-level handler instead,
// where every frame is consistent; the at-once one only when the main thread does not get
// there (blocked in C code, where its frames stand still).
struct StackSignals {
  int safe = 0, at_once = 0;
};
StackSignals HookSignals();
// Whether `pid` catches `signo` (its SigCgt in /proc): the hook is installed.
bool Catches(pid_t pid, int signo);
// The sitecustomize.py crun writes for its Python workers (in a directory put first on
// PYTHONPATH): registers the hook, then runs the sitecustomize it shadows, if any.
const char* PythonHookSource();

struct StackTools {
  std::string py_spy, eu_stack, gdb;  // absolute paths; empty: not found
};
// Looks for the tools on `path` (a PATH value), and for py-spy also in `extra_dirs` first.
StackTools FindStackTools(const std::string& path, const std::vector<std::string>& extra_dirs);

struct StackTarget {
  std::string host;
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  StackPipe* hook = nullptr;  // the worker's pipe, when it has one
};

// Reads the stacks of every target at once (each tool run has `deadline`), then calls
// `done` on the event loop with one RankStacks per target, in the targets' order.
void CaptureStacks(boost::asio::io_context& io, const std::vector<StackTarget>& targets,
                   const StackTools& tools, std::chrono::milliseconds deadline,
                   std::function<void(std::vector<RankStacks>)> done);

}  // namespace crun::agent
