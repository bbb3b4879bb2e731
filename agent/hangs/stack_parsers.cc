#include "agent/hangs/stack_parsers.h"

#include <functional>
#include <string_view>

#include "base/numbers.h"
#include "base/text.h"

namespace crun::agent {
namespace {

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

}  // namespace

// py-spy dump:
//   Thread 1234 (idle): "MainThread"
//       hang_here (p.py:5)
std::vector<ThreadStack> ParsePySpy(const std::string& text) {
  std::vector<ThreadStack> threads;
  for (const auto& raw : SplitLines(text)) {
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
  for (const auto& raw : SplitLines(text)) {
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
  for (const auto& raw : SplitLines(text)) {
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
  for (const auto& raw : SplitLines(text)) {
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

}  // namespace crun::agent
