#include "agent/hangs/stack_capture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/hangs/python_hook.h"
#include "agent/hangs/stack_parsers.h"
#include "agent/hangs/stack_pipe.h"
#include "agent/supervise/tool_run.h"
#include "base/files.h"
#include "base/proc.h"
#include "base/text.h"

namespace crun::agent {

namespace asio = boost::asio;
using std::chrono::milliseconds;

StackTools FindStackTools(const std::string& path, const std::vector<std::string>& extra_dirs) {
  auto executable = [](const std::string& file) { return ::access(file.c_str(), X_OK) == 0; };
  auto on_path = [&](const char* name) { return FindOnPath(name, path); };
  StackTools t;
  for (const auto& dir : extra_dirs) {
    if (!dir.empty() && executable(dir + "/py-spy")) {
      t.py_spy = dir + "/py-spy";
      break;
    }
  }
  if (t.py_spy.empty()) t.py_spy = on_path("py-spy");
  t.eu_stack = on_path("eu-stack");
  t.gdb = on_path("gdb");
  return t;
}

namespace {

// The last line of a tool's output, for the error when it failed.
std::string LastLine(const std::string& output) {
  const auto lines = SplitLines(output);
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (!Trim(*it).empty()) return std::string(Trim(*it));
  }
  return "no output";
}

bool LooksLikePython(pid_t pid) {
  char exe[4096];
  const std::string link = "/proc/" + std::to_string(pid) + "/exe";
  const ssize_t n = ::readlink(link.c_str(), exe, sizeof exe - 1);
  if (n <= 0) return false;
  std::string path(exe, static_cast<std::size_t>(n));
  const auto slash = path.rfind('/');
  return std::string_view(path)
      .substr(slash == std::string::npos ? 0 : slash + 1)
      .starts_with("python");
}

// One target's methods, tried in order until one gives a stack.
struct Method {
  std::string tool;
  std::vector<std::string> argv;  // empty: the hook
};

struct Capture {
  ChildRegistry* children;  // where the tools run as children
  std::vector<RankStacks> results;
  std::size_t pending = 0;
  std::function<void(std::vector<RankStacks>)> done;
};

void TryNext(asio::io_context& io, std::shared_ptr<Capture> c, std::size_t i, StackPipe* hook,
             std::vector<Method> methods, std::size_t next, milliseconds deadline) {
  RankStacks& r = c->results[i];
  if (next >= methods.size()) {
    if (r.error.empty()) {
      r.error = "no way to read it: install py-spy (Python) or elfutils' eu-stack or gdb";
    }
    if (--c->pending == 0) c->done(std::move(c->results));
    return;
  }
  const Method m = methods[next];
  // `label`: the tool as the report names it, when not `m.tool`.
  auto finish = [&io, c, i, hook, methods, next, deadline, m](bool ok, std::string text,
                                                              std::string label) {
    RankStacks& result = c->results[i];
    std::vector<ThreadStack> threads;
    if (ok) {
      if (m.tool == "py-spy") threads = ParsePySpy(text);
      if (m.tool == "faulthandler") threads = ParseFaulthandler(text);
      if (m.tool == "eu-stack") threads = ParseEuStack(text, result.pid);
      if (m.tool == "gdb") threads = ParseGdb(text, result.pid);
    }
    if (!threads.empty()) {
      result.tool = label.empty() ? m.tool : std::move(label);
      result.text = std::move(text);
      result.threads = std::move(threads);
      result.error.clear();
      if (--c->pending == 0) c->done(std::move(c->results));
      return;
    }
    result.error += (result.error.empty() ? "" : "; ") + m.tool + ": " +
                    (ok ? std::string("no stack in its output") : LastLine(text));
    TryNext(io, c, i, hook, methods, next + 1, deadline);
  };
  if (m.argv.empty()) {
    StackPipe::Timing timing;
    timing.deadline = std::min(deadline, timing.deadline);
    hook->Request(r.pid, timing, [finish](std::string text, bool at_once) {
      const bool ok = !text.empty();
      // Which of the hook's two answers it was (docs/hangs.md).
      finish(ok, ok ? std::move(text) : "no answer to the stack signals",
             at_once ? "faulthandler (signal handler)" : "");
    });
  } else {
    RunTool(io, *c->children, {m.argv, {}}, deadline, [finish](ToolResult run) {
      if (!run.started) return finish(false, std::move(run.error), "");
      if (run.timed_out) return finish(false, "did not answer in time; killed", "");
      finish(run.exit.success(), std::move(run.output), "");
    });
  }
}

}  // namespace

void CaptureStacks(asio::io_context& io, ChildRegistry& children,
                   const std::vector<StackTarget>& targets, const StackTools& tools,
                   milliseconds deadline, std::function<void(std::vector<RankStacks>)> done) {
  auto c = std::make_shared<Capture>();
  c->children = &children;
  c->done = std::move(done);
  c->pending = targets.size();
  for (const auto& t : targets) {
    RankStacks r;
    r.host = t.host;
    r.rank = t.rank;
    r.local_rank = t.local_rank;
    r.pid = t.pid;
    c->results.push_back(std::move(r));
  }
  if (targets.empty()) {
    asio::post(io, [c] { c->done({}); });
    return;
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const auto& t = targets[i];
    const std::string pid = std::to_string(t.pid);
    // A stopped process (SIGSTOP, a debugger) runs no signal handler: not the hook then.
    const bool stopped = ProcessState(t.pid) == 't' || ProcessState(t.pid) == 'T';
    const bool hooked =
        t.hook != nullptr && !stopped &&
        (Catches(t.pid, HookSignals().safe) || Catches(t.pid, HookSignals().at_once));
    const bool python = hooked || LooksLikePython(t.pid);
    std::vector<Method> methods;
    if (python && !tools.py_spy.empty())
      methods.push_back({"py-spy", {tools.py_spy, "dump", "--pid", pid}});
    if (hooked) methods.push_back({"faulthandler", {}});
    if (!tools.eu_stack.empty()) methods.push_back({"eu-stack", {tools.eu_stack, "-p", pid}});
    if (!tools.gdb.empty()) {
      methods.push_back(
          {"gdb", {tools.gdb, "-p", pid, "-batch", "-nx", "-ex", "thread apply all bt"}});
    }
    TryNext(io, c, i, t.hook, std::move(methods), 0, deadline);
  }
}

}  // namespace crun::agent
