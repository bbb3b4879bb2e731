// One worker's stacks as crun reads them (stack_capture.h) and shows them (stack_summary.h):
// its threads and their frames, one rank's, and other nodes' through the rendezvous.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

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

}  // namespace crun::agent
