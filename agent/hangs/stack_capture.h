// Stacks of running workers, for hangs and `crun stacks` (docs/hangs.md), read without
// stopping the job; parsed by stack_parsers.h and summarised by stack_summary.h ("rank 5: in
// `load_batch` <- `train_step`; ranks 0-4,6-7: in `all_reduce`").
//
// How a worker's stacks are read, best first:
// * Python: py-spy (`py-spy dump`, when installed: crun's PATH or beside the workers'
//   interpreter); else the hook crun installs in every Python worker (a sitecustomize writing
//   faulthandler's dump to a pipe crun reads: StackPipe), on one of two real-time signals.
// * Native (and Python where neither works): eu-stack (elfutils), else gdb.
// The tools run as crun's children; workers name crun as their tracer (supervise/spawn.h), so this
// works where Yama allows tracing only by ancestors.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/hangs/stack_model.h"
#include "agent/supervise/children.h"

namespace crun::agent {

class StackPipe;

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

// Reads the stacks of every target at once (each tool run has `deadline`, and runs as a child
// owned in `children`, which must outlive it), then calls `done` on the event loop with one
// RankStacks per target, in the targets' order.
void CaptureStacks(boost::asio::io_context& io, ChildRegistry& children,
                   const std::vector<StackTarget>& targets, const StackTools& tools,
                   std::chrono::milliseconds deadline,
                   std::function<void(std::vector<RankStacks>)> done);

}  // namespace crun::agent
