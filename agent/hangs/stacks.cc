#include "agent/hangs/stacks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <boost/asio/post.hpp>

#include "agent/supervise/process.h"
#include "base/numbers.h"
#include "base/proc.h"
#include "base/text.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

int ToInt(std::string_view s) {
  const auto v = ParseInteger(std::string(s), 0, 1'000'000'000);
  return v ? static_cast<int>(*v) : 0;
}

// Marks the main thread: the one `is_main` picks, else `fallback` (an index; -1: the last).
void MarkMain(std::vector<ThreadStack>& threads,
              const std::function<bool(const ThreadStack&)>& is_main, int fallback) {
  if (threads.empty()) return;
  for (auto& t : threads) {
    if (is_main(t)) {
      t.main = true;
      return;
    }
  }
  threads[fallback < 0 ? threads.size() - 1 : static_cast<std::size_t>(fallback)].main = true;
}

// "[0x... in ]name (args) [at file:line | from lib]" of a gdb frame line after "#N  ".
Frame GdbFrame(std::string_view s) {
  Frame f;
  if (const auto in = s.find(" in "); s.starts_with("0x") && in != std::string_view::npos) {
    s.remove_prefix(in + 4);
  }
  const auto paren = s.find(" (");
  f.function = std::string(Trim(s.substr(0, paren)));
  if (const auto at = s.rfind(") at "); at != std::string_view::npos) {
    const std::string_view where = s.substr(at + 5);
    const auto colon = where.rfind(':');
    f.file = std::string(where.substr(0, colon));
    if (colon != std::string_view::npos) f.line = ToInt(where.substr(colon + 1));
  } else if (const auto from = s.rfind(" from "); from != std::string_view::npos) {
    f.file = std::string(s.substr(from + 6));
  }
  return f;
}

// C library and kernel-interface frames every waiting thread has on top: not where it waits.
bool IsWaitPrimitive(const std::string& function) {
  static const char* const kNames[] = {"clock_nanosleep",
                                       "nanosleep",
                                       "sleep",
                                       "usleep",
                                       "pause",
                                       "poll",
                                       "ppoll",
                                       "select",
                                       "pselect",
                                       "epoll_wait",
                                       "epoll_pwait",
                                       "read",
                                       "recv",
                                       "recvmsg",
                                       "recvfrom",
                                       "write",
                                       "futex_wait",
                                       "syscall",
                                       "pthread_cond_wait",
                                       "pthread_cond_timedwait",
                                       "sem_wait",
                                       "pthread_join",
                                       "wait4",
                                       "waitpid",
                                       "accept",
                                       "connect",
                                       "do_futex_wait",
                                       "futex_abstimed_wait_common",
                                       "pthread_cond_clockwait",
                                       "__pthread_clockjoin_ex"};
  std::string name = function;
  if (const auto at = name.find('@'); at != std::string::npos) name.resize(at);
  while (!name.empty() && name.front() == '_') name.erase(0, 1);
  if (name.starts_with("GI_")) name.erase(0, 3);
  while (!name.empty() && name.front() == '_') name.erase(0, 1);
  for (const char* n : kNames) {
    std::string_view k(n);
    while (!k.empty() && k.front() == '_') k.remove_prefix(1);
    if (name == k) return true;
  }
  return name.empty() || name == "??";
}

// A function name short enough for a summary line: no arguments, no template arguments.
std::string ShortName(const std::string& given) {
  std::string function = given;
  static const std::string kAnonymous = "(anonymous namespace)::";
  for (auto at = function.find(kAnonymous); at != std::string::npos;
       at = function.find(kAnonymous)) {
    function.erase(at, kAnonymous.size());
  }
  std::string out;
  int depth = 0;
  for (char c : function) {
    if (c == '<' && !out.empty() && out.back() != '<' && out != "operator") {
      ++depth;
      continue;
    }
    if (c == '>' && depth > 0) {
      --depth;
      continue;
    }
    if (depth > 0) continue;
    if (c == '(' && !out.empty()) break;
    out.push_back(c);
  }
  return out.empty() ? function : out;
}

}  // namespace

// ---- parsers -------------------------------------------------------------------------------

// py-spy dump:
//   Thread 1234 (idle): "MainThread"
//       hang_here (p.py:5)
std::vector<ThreadStack> ParsePySpy(const std::string& text) {
  std::vector<ThreadStack> threads;
  for (const auto& raw : Lines(text)) {
    const std::string_view line(raw);
    if (line.starts_with("Thread ")) {
      ThreadStack t;
      t.title = raw;
      threads.push_back(std::move(t));
      continue;
    }
    if (threads.empty() || !line.starts_with("    ") || line.starts_with("        ")) continue;
    const std::string_view s = Trim(line);
    Frame f;
    const auto open = s.rfind(" (");
    if (open != std::string_view::npos && s.back() == ')') {
      f.function = std::string(s.substr(0, open));
      const std::string_view where = s.substr(open + 2, s.size() - open - 3);
      const auto colon = where.rfind(':');
      f.file = std::string(where.substr(0, colon));
      if (colon != std::string_view::npos) f.line = ToInt(where.substr(colon + 1));
    } else {
      f.function = std::string(s);
    }
    threads.back().frames.push_back(std::move(f));
  }
  MarkMain(
      threads,
      [](const ThreadStack& t) { return t.title.find("\"MainThread\"") != std::string::npos; }, 0);
  return threads;
}

// faulthandler (all threads):
//   Current thread 0x00007f... (most recent call first):
//     File "/tmp/p.py", line 5 in hang_here
// CPython lists the newest thread first, so the main thread is the last one.
std::vector<ThreadStack> ParseFaulthandler(const std::string& text) {
  std::vector<ThreadStack> threads;
  for (const auto& raw : Lines(text)) {
    const std::string_view line(raw);
    if ((line.starts_with("Thread 0x") || line.starts_with("Current thread 0x")) &&
        line.find("most recent call first") != std::string_view::npos) {
      ThreadStack t;
      t.title = std::string(Trim(line.substr(0, line.find(" (most recent"))));
      threads.push_back(std::move(t));
      continue;
    }
    const std::string_view s = Trim(line);
    if (threads.empty() || !s.starts_with("File \"")) continue;
    Frame f;
    const auto close = s.find('"', 6);
    if (close == std::string_view::npos) continue;
    f.file = std::string(s.substr(6, close - 6));
    const std::string_view rest = s.substr(close + 1);
    if (const auto l = rest.find("line "); l != std::string_view::npos) {
      f.line = ToInt(rest.substr(l + 5, rest.find(' ', l + 5) - (l + 5)));
    }
    if (const auto in = rest.find(" in "); in != std::string_view::npos) {
      f.function = std::string(Trim(rest.substr(in + 4)));
    }
    // The hook's own handler (a safe-point dump) is not where the thread was.
    if (threads.back().frames.empty() && f.function == "_crun_dump_stacks") continue;
    threads.back().frames.push_back(std::move(f));
  }
  MarkMain(
      threads, [](const ThreadStack&) { return false; }, -1);
  return threads;
}

// eu-stack -p:
//   TID 1234:
//   #0  0x00007f852071c545 clock_nanosleep@GLIBC_2.2.5
std::vector<ThreadStack> ParseEuStack(const std::string& text, pid_t pid) {
  std::vector<ThreadStack> threads;
  for (const auto& raw : Lines(text)) {
    const std::string_view line(raw);
    if (line.starts_with("TID ")) {
      ThreadStack t;
      t.title = std::string(Trim(line.substr(0, line.find(':'))));
      threads.push_back(std::move(t));
      continue;
    }
    if (threads.empty() || !line.starts_with("#")) continue;
    // "#N  0xADDR name" (the name is absent when unknown)
    std::string_view s =
        Trim(line.substr(line.find(' ') == std::string_view::npos ? line.size() : line.find(' ')));
    const auto space = s.find(' ');
    Frame f;
    f.function = space == std::string_view::npos ? "??" : std::string(Trim(s.substr(space)));
    if (const auto nl = f.function.find(" - "); nl != std::string::npos) {
      f.file = f.function.substr(nl + 3);
      f.function.resize(nl);
    }
    threads.back().frames.push_back(std::move(f));
  }
  const std::string main_title = "TID " + std::to_string(pid);
  MarkMain(
      threads, [&](const ThreadStack& t) { return t.title == main_title; }, 0);
  return threads;
}

// gdb -batch -ex "thread apply all bt":
//   Thread 1 (Thread 0x7f... (LWP 1234) "prog"):
//   #0  0x00007f... in hang_here () at n.c:4
std::vector<ThreadStack> ParseGdb(const std::string& text, pid_t pid) {
  std::vector<ThreadStack> threads;
  for (const auto& raw : Lines(text)) {
    const std::string_view line(raw);
    if (line.starts_with("Thread ") && line.find("(LWP ") != std::string_view::npos) {
      ThreadStack t;
      t.title = std::string(Trim(line));
      if (!t.title.empty() && t.title.back() == ':') t.title.pop_back();
      threads.push_back(std::move(t));
      continue;
    }
    if (threads.empty() || !line.starts_with("#")) continue;
    const auto space = line.find(' ');
    if (space == std::string_view::npos) continue;
    threads.back().frames.push_back(GdbFrame(Trim(line.substr(space))));
  }
  const std::string lwp = "(LWP " + std::to_string(pid) + ")";
  MarkMain(
      threads, [&](const ThreadStack& t) { return t.title.find(lwp) != std::string::npos; }, -1);
  return threads;
}

// ---- summaries -----------------------------------------------------------------------------

namespace {

const ThreadStack* MainThread(const RankStacks& stacks) {
  for (const auto& t : stacks.threads) {
    if (t.main) return &t;
  }
  return stacks.threads.empty() ? nullptr : &stacks.threads.front();
}

// A frame of a collective: torch.distributed's c10d API, or a collective by name (the SDK's,
// Gloo's, NCCL's).
bool IsCollectiveFrame(const Frame& f) {
  if (f.file.find("distributed_c10d.py") != std::string::npos) return true;
  std::string name;
  for (char c : f.function)
    name.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (name.find("nccl") != std::string::npos) return true;
  for (const char* k : {"allreduce", "all_reduce", "allgather", "all_gather", "reducescatter",
                        "reduce_scatter", "broadcast", "barrier", "alltoall", "all_to_all"}) {
    if (name.find(k) != std::string::npos) return true;
  }
  return false;
}

// The thread that says where a rank is: its main thread, unless that only waits for another
// thread ("...Wait", the SDK's executor) that is in a collective: then that one.
const ThreadStack* PlaceThread(const RankStacks& stacks) {
  const ThreadStack* main = MainThread(stacks);
  const auto& frames = main->frames;
  if (std::any_of(frames.begin(), frames.end(), IsCollectiveFrame)) return main;
  const auto top = std::find_if(frames.begin(), frames.end(),
                                [](const Frame& f) { return !IsWaitPrimitive(f.function); });
  if (top == frames.end() || top->function.find("Wait") == std::string::npos) return main;
  for (const auto& t : stacks.threads) {
    for (const auto& f : t.frames) {
      if (IsCollectiveFrame(f)) return &t;
    }
  }
  return main;
}

// Any thread: the SDK runs its collectives on a thread of its own, which the main thread waits
// for.
bool InCollective(const RankStacks& stacks) {
  for (const auto& t : stacks.threads) {
    for (const auto& f : t.frames) {
      if (IsCollectiveFrame(f)) return true;
    }
  }
  return false;
}

}  // namespace

std::string WhereWaiting(const RankStacks& stacks) {
  if (stacks.threads.empty()) {
    return "no stack (" + (stacks.error.empty() ? std::string("nothing read") : stacks.error) + ")";
  }
  const ThreadStack* main = PlaceThread(stacks);
  if (main->frames.empty()) {
    // A thread read with no frame in it: a worker still starting ("<no Python frame>").
    return "no frame in " + (main->title.empty() ? std::string("its main thread") : main->title) +
           " (" + stacks.tool + ")";
  }
  const bool native = stacks.tool == "eu-stack" || stacks.tool == "gdb";
  std::vector<std::string> names;
  for (const auto& f : main->frames) {
    if (native && names.empty() && IsWaitPrimitive(f.function)) continue;
    names.push_back(native ? ShortName(f.function) : f.function);
    if (names.size() == 3) break;
  }
  if (names.empty()) return "in the C library (" + main->frames.front().function + ")";
  std::string out = "in `" + names[0] + "`";
  for (std::size_t i = 1; i < names.size(); ++i) out += " <- `" + names[i] + "`";
  return out;
}

std::set<int> SuspectRanks(const std::vector<RankStacks>& ranks) {
  std::set<int> all, waiting, free;
  std::map<std::string, std::set<int>> groups;
  for (const auto& r : ranks) {
    all.insert(r.rank);
    if (r.threads.empty()) continue;
    (InCollective(r) ? waiting : free).insert(r.rank);
    groups[WhereWaiting(r)].insert(r.rank);
  }
  if (!waiting.empty() && !free.empty()) return free;
  if (groups.size() > 1) {
    std::size_t smallest = all.size(), count = 0;
    for (const auto& [where, members] : groups) smallest = std::min(smallest, members.size());
    const std::set<int>* only = nullptr;
    for (const auto& [where, members] : groups) {
      if (members.size() == smallest) {
        ++count;
        only = &members;
      }
    }
    if (count == 1) return *only;
  }
  return all;
}

std::string RankRanges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::vector<std::string> GroupSummary(const std::vector<RankStacks>& ranks,
                                      const std::set<int>& first) {
  std::map<std::string, std::vector<int>> groups;
  for (const auto& r : ranks) groups[WhereWaiting(r)].push_back(r.rank);
  std::vector<std::pair<std::string, std::vector<int>>> sorted(groups.begin(), groups.end());
  auto leads = [&](const std::vector<int>& members) {
    return std::any_of(members.begin(), members.end(), [&](int r) { return first.count(r) > 0; });
  };
  std::stable_sort(sorted.begin(), sorted.end(), [&](const auto& a, const auto& b) {
    if (leads(a.second) != leads(b.second)) return leads(a.second);
    if (a.second.size() != b.second.size()) return a.second.size() < b.second.size();
    return *std::min_element(a.second.begin(), a.second.end()) <
           *std::min_element(b.second.begin(), b.second.end());
  });
  std::vector<std::string> out;
  for (const auto& [where, members] : sorted) {
    out.push_back((members.size() == 1 ? "rank " : "ranks ") + RankRanges(members) + ": " + where);
  }
  return out;
}

std::string FormatStacks(const std::vector<RankStacks>& ranks, const std::set<int>& always) {
  std::string out;
  for (const auto& line : GroupSummary(ranks, always)) out += "  " + line + "\n";
  std::set<std::string> shown_places;
  std::vector<int> left_out;
  out += "Stacks:\n";
  for (const auto& s : ranks) {
    const bool first_of_group = shown_places.insert(WhereWaiting(s)).second;
    if (ranks.size() <= 8 || first_of_group || always.count(s.rank)) {
      std::istringstream in(FormatRankStacks(s));
      std::string line;
      while (std::getline(in, line)) out += "  " + line + "\n";
    } else {
      left_out.push_back(s.rank);
    }
  }
  if (!left_out.empty()) {
    out += "  (ranks " + RankRanges(left_out) + ": in the same places as shown above)\n";
  }
  return out;
}

std::string FormatRankStacks(const RankStacks& s) {
  std::string out = "rank " + std::to_string(s.rank) + " (local rank " +
                    std::to_string(s.local_rank) + ", pid " + std::to_string(s.pid) +
                    (s.host.empty() ? "" : ", " + s.host) + ")";
  if (s.tool.empty()) return out + ": no stack: " + s.error + "\n";
  out += ", by " + s.tool + ":\n";
  for (const auto& t : s.threads) {
    out += "  " + t.title + (t.main ? "  [main thread]" : "") + "\n";
    for (const auto& f : t.frames) {
      out += "    " + f.function;
      if (!f.file.empty())
        out += " (" + f.file + (f.line > 0 ? ":" + std::to_string(f.line) : "") + ")";
      out += "\n";
    }
  }
  return out;
}

nlohmann::json StacksJson(const RankStacks& s) {
  nlohmann::json threads = nlohmann::json::array();
  for (const auto& t : s.threads) {
    nlohmann::json frames = nlohmann::json::array();
    for (const auto& f : t.frames) {
      frames.push_back({{"function", f.function}, {"file", f.file}, {"line", f.line}});
    }
    threads.push_back({{"title", t.title}, {"main", t.main}, {"frames", std::move(frames)}});
  }
  return {{"host", s.host},   {"rank", s.rank}, {"local_rank", s.local_rank},
          {"pid", s.pid},     {"tool", s.tool}, {"where", WhereWaiting(s)},
          {"error", s.error}, {"text", s.text}, {"threads", std::move(threads)}};
}

RankStacks StacksFromJson(const nlohmann::json& j) {
  RankStacks s;
  s.host = j.value("host", "");
  s.rank = j.value("rank", 0);
  s.local_rank = j.value("local_rank", 0);
  s.pid = j.value("pid", 0);
  s.tool = j.value("tool", "");
  s.error = j.value("error", "");
  s.text = j.value("text", "");
  if (j.contains("threads") && j["threads"].is_array()) {
    for (const auto& t : j["threads"]) {
      ThreadStack ts;
      ts.title = t.value("title", "");
      ts.main = t.value("main", false);
      if (t.contains("frames") && t["frames"].is_array()) {
        for (const auto& f : t["frames"]) {
          ts.frames.push_back({f.value("function", ""), f.value("file", ""), f.value("line", 0)});
        }
      }
      s.threads.push_back(std::move(ts));
    }
  }
  return s;
}

// ---- the Python hook -------------------------------------------------------------------------

StackSignals HookSignals() { return {SIGRTMIN + 8, SIGRTMIN + 9}; }

namespace {
constexpr std::string_view kDumpBegin = "crun-stacks-begin\n";
constexpr std::string_view kDumpEnd = "crun-stacks-end\n";
}  // namespace

bool Catches(pid_t pid, int signo) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("SigCgt:")) continue;
    const std::string hex(Trim(std::string_view(line).substr(7)));
    errno = 0;
    const unsigned long long mask = std::strtoull(hex.c_str(), nullptr, 16);
    return errno == 0 && signo >= 1 && signo <= 64 && ((mask >> (signo - 1)) & 1ULL) != 0;
  }
  return false;
}

const char* PythonHookSource() {
  return R"PY(# Written by crun (docs/hangs.md): lets crun read this worker's Python stacks while it
# runs: on one signal, at the main thread's next safe point (a Python-level handler, where
# every frame is consistent), on another at once from the signal handler (for a main thread
# blocked in C code), faulthandler writes every thread's stack to a pipe crun reads. It takes
# its own directory off sys.path and PYTHONPATH again, so that the program sees both as they
# were, and runs the sitecustomize module this one shadows, if there is one.


def _crun_register_stack_hook():
    import os
    fd = os.environ.pop("CRUN_STACKS_FD", None)
    safe = os.environ.pop("CRUN_STACKS_SAFE_SIGNAL", None)
    at_once = os.environ.pop("CRUN_STACKS_SIGNAL", None)
    if fd is None or safe is None or at_once is None:
        return
    try:
        import faulthandler
        import signal
        fd = int(fd)
        os.fstat(fd)

        def _crun_dump_stacks(signum, frame):
            try:
                os.write(fd, b"crun-stacks-begin\n")
                faulthandler.dump_traceback(file=fd, all_threads=True)
                os.write(fd, b"crun-stacks-end\n")
            except OSError:
                pass

        signal.signal(int(safe), _crun_dump_stacks)
        faulthandler.register(int(at_once), file=fd, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        pass


def _crun_leave_path():
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    # crun put this directory first on PYTHONPATH; the rest is what the user had.
    parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if parts and os.path.abspath(parts[0] or os.curdir) == here:
        if len(parts) == 1:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = os.pathsep.join(parts[1:])
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


def _crun_run_shadowed_sitecustomize():
    import importlib
    import sys
    this = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as e:
        if e.name != "sitecustomize":
            raise
        if this is not None:
            sys.modules["sitecustomize"] = this


# Imported as sitecustomize at a worker's start; a warm worker runs the first two itself
# (agent/warm/template.py), with the environment crun gave it.
if __name__ == "sitecustomize":
    _crun_register_stack_hook()
    _crun_leave_path()
    _crun_run_shadowed_sitecustomize()
)PY";
}

// ---- StackPipe ---------------------------------------------------------------------------------

StatusOr<std::unique_ptr<StackPipe>> StackPipe::Create(asio::io_context& io) {
  auto self = std::unique_ptr<StackPipe>(new StackPipe(io));
  auto pipe =
      WorkerPipe::Create(io, [raw = self.get()](std::string_view data) { raw->OnData(data); });
  if (!pipe.ok()) return pipe.status();
  self->pipe_ = std::move(pipe).value();
  return self;
}

StackPipe::StackPipe(asio::io_context& io) : step_timer_(io), deadline_timer_(io) {}

StackPipe::~StackPipe() { Finish(); }

void StackPipe::OnData(std::string_view data) {
  if (!done_) return;  // nobody asked: a stray write (a late answer to an earlier request)
  constexpr std::size_t kMax = std::size_t{4} << 20;
  buffer_.append(data.substr(0, kMax - std::min(buffer_.size(), kMax)));
  // A complete safe dump is the answer, even one that came after the at-once signal was sent
  // (the two may then be interleaved in the buffer: the marked one is whole).
  if (const auto begin = buffer_.find(kDumpBegin); begin != std::string::npos) {
    const auto from = begin + kDumpBegin.size();
    if (const auto end = buffer_.find(kDumpEnd, from); end != std::string::npos) {
      buffer_ = buffer_.substr(from, end - from);
      at_once_ = false;  // the answer is the safe one
      return Finish();
    }
    if (!at_once_) return;  // the rest of the safe dump is on its way
  }
  if (!at_once_) return;
  step_timer_.expires_after(quiet_);
  step_timer_.async_wait([this](const boost::system::error_code& e) {
    if (!e) Finish();
  });
}

void StackPipe::Request(pid_t pid, Timing timing, std::function<void(std::string, bool)> done) {
  if (done_) Finish();  // one request at a time: the earlier one ends with what it has
  buffer_.clear();
  pid_ = pid;
  at_once_ = false;
  quiet_ = timing.quiet;
  done_ = std::move(done);
  // Room for a large dump (the default 64 KiB holds about 60 threads of 20 frames): the
  // writer may be a signal handler that must not block, so it writes non-blocking, and
  // anything past a full pipe would be lost. Asked for here, not when every worker starts.
  ::fcntl(pipe_->read_fd(), F_SETPIPE_SZ, 1 << 20);
  deadline_timer_.expires_after(timing.deadline);
  deadline_timer_.async_wait([this](const boost::system::error_code& e) {
    if (!e) Finish();
  });
  const StackSignals signals = HookSignals();
  if (!Catches(pid, signals.safe) || ::kill(pid, signals.safe) != 0) return AskAtOnce();
  step_timer_.expires_after(timing.safe_wait);
  step_timer_.async_wait([this](const boost::system::error_code& e) {
    if (!e && buffer_.find(kDumpBegin) == std::string::npos) AskAtOnce();
  });
}

void StackPipe::AskAtOnce() {
  at_once_ = true;
  if (!Catches(pid_, HookSignals().at_once) || ::kill(pid_, HookSignals().at_once) != 0) {
    return Finish();
  }
}

void StackPipe::Finish() {
  step_timer_.cancel();
  deadline_timer_.cancel();
  const bool at_once = std::exchange(at_once_, false);
  if (auto done = std::exchange(done_, nullptr)) done(std::exchange(buffer_, {}), at_once);
}

// ---- tools -------------------------------------------------------------------------------------

StackTools FindStackTools(const std::string& path, const std::vector<std::string>& extra_dirs) {
  auto executable = [](const std::string& file) { return ::access(file.c_str(), X_OK) == 0; };
  auto on_path = [&](const char* name) -> std::string {
    std::size_t start = 0;
    while (start <= path.size()) {
      const auto end = std::min(path.find(':', start), path.size());
      const std::string dir = path.substr(start, end - start);
      if (!dir.empty() && dir.front() == '/' && executable(dir + "/" + name)) {
        return dir + "/" + name;
      }
      start = end + 1;
    }
    return "";
  };
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

// One run of a stack tool: its output (stdout and stderr together) and exit, or a kill at
// the deadline.
class ToolRun : public std::enable_shared_from_this<ToolRun> {
 public:
  using Done = std::function<void(bool ok, std::string output)>;
  static void Start(asio::io_context& io, std::vector<std::string> argv, milliseconds deadline,
                    Done done) {
    auto run = std::shared_ptr<ToolRun>(new ToolRun(io, std::move(done)));
    run->Begin(std::move(argv), deadline);
  }

 private:
  ToolRun(asio::io_context& io, Done done)
      : io_(io), pipe_(io), deadline_(io), done_(std::move(done)) {}

  void Begin(std::vector<std::string> argv, milliseconds deadline) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Fail(PosixError("pipe", errno).message());
    ProcessSpec spec;
    spec.argv = std::move(argv);
    spec.envp = {"PATH=/usr/bin:/bin", "LC_ALL=C"};
    spec.stdout_fd = p[1];
    spec.stderr_fd = p[1];
    const std::string name = spec.argv[0];
    auto pid = SpawnProcess(spec);
    ::close(p[1]);
    if (!pid.ok()) {
      ::close(p[0]);
      return Fail(pid.status().message());
    }
    pid_ = *pid;
    pipe_.assign(p[0]);
    auto self = shared_from_this();
    auto watcher = ExitWatcher::Watch(io_, pid_, [self](ExitStatus s) {
      self->exit_ = s;
      self->exited_ = true;
      self->MaybeDone();
    });
    if (!watcher.ok()) {
      ::kill(-pid_, SIGKILL);
      return Fail(watcher.status().message());
    }
    watcher_ = std::move(watcher).value();
    deadline_.expires_after(deadline);
    deadline_.async_wait([self, deadline](const boost::system::error_code& ec) {
      if (ec || self->exited_) return;
      self->timed_out_ = true;
      ::kill(-self->pid_, SIGKILL);
    });
    Read();
  }

  void Read() {
    auto self = shared_from_this();
    pipe_.async_read_some(asio::buffer(chunk_),
                          [self](const boost::system::error_code& ec, std::size_t n) {
                            if (ec) {
                              self->eof_ = true;
                              return self->MaybeDone();
                            }
                            if (self->output_.size() < (std::size_t{4} << 20))
                              self->output_.append(self->chunk_, n);
                            self->Read();
                          });
  }

  void MaybeDone() {
    if (!eof_ || !exited_ || !done_) return;
    deadline_.cancel();
    if (timed_out_) {
      return std::exchange(done_, nullptr)(false, "did not answer in time; killed");
    }
    std::exchange(done_, nullptr)(exit_.success(), std::move(output_));
  }

  void Fail(std::string why) {
    auto done = std::exchange(done_, nullptr);
    asio::post(io_, [done, why] { done(false, why); });
  }

  asio::io_context& io_;
  asio::posix::stream_descriptor pipe_;
  asio::steady_timer deadline_;
  Done done_;
  pid_t pid_ = 0;
  std::unique_ptr<ExitWatcher> watcher_;
  ExitStatus exit_;
  bool exited_ = false, eof_ = false, timed_out_ = false;
  std::string output_;
  char chunk_[16384];
};

// The last line of a tool's output, for the error when it failed.
std::string LastLine(const std::string& output) {
  const auto lines = Lines(output);
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
    ToolRun::Start(io, m.argv, deadline,
                   [finish](bool ok, std::string text) { finish(ok, std::move(text), ""); });
  }
}

}  // namespace

void CaptureStacks(asio::io_context& io, const std::vector<StackTarget>& targets,
                   const StackTools& tools, milliseconds deadline,
                   std::function<void(std::vector<RankStacks>)> done) {
  auto c = std::make_shared<Capture>();
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
