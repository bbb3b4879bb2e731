// Hang detection's parts with real processes, pipes and tools (docs/hangs.md): the parsers of
// each stack tool's output (captured from the real tools), the summaries, HangWatch on real
// children (silent, making progress, stopped), torchelastic's file-timer protocol on a real
// named pipe, and stack capture of a real native and a real Python process.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/hangs/file_timer.h"
#include "agent/hangs/hang_watch.h"
#include "agent/hangs/python_hook.h"
#include "agent/hangs/stack_capture.h"
#include "agent/hangs/stack_parsers.h"
#include "agent/hangs/stack_pipe.h"
#include "agent/hangs/stack_summary.h"
#include "agent/supervise/oom.h"
#include "agent/supervise/spawn.h"
#include "base/proc.h"
#include "tests/unit/temp_dir.h"

namespace {

namespace asio = boost::asio;
using namespace crun::agent;
using std::chrono::milliseconds;

// This process's children, as the worker group would own them.
ChildRegistry& Children() {
  static ChildRegistry children;
  return children;
}

// A child that runs until killed; killed and reaped at the end of the test.
struct Child {
  pid_t pid = -1;
  explicit Child(const ProcessSpec& spec) {
    auto p = SpawnProcess(spec, Children());
    REQUIRE(p.ok());
    pid = *p;
  }
  explicit Child(std::vector<std::string> argv) : Child(Spec(std::move(argv))) {}
  static ProcessSpec Spec(std::vector<std::string> argv) {
    ProcessSpec s;
    s.argv = std::move(argv);
    s.envp = {"PATH=/usr/bin:/bin"};
    return s;
  }
  ~Child() {
    ::kill(pid, SIGKILL);
    int status;
    Children().Reap(pid, &status, 0);
  }
};

// Runs `io` until `done()` or 20 s (a test failure then).
template <typename Done>
void RunUntil(asio::io_context& io, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    io.run_for(milliseconds(10));
    io.restart();
  }
  REQUIRE(done());
}

const char* kPySpy = R"(Process 11447: /usr/bin/python3 p.py
Python v3.11.2 (/usr/bin/python3.11)

Thread 11447 (idle): "MainThread"
    hang_here (p.py:5)
    main (p.py:8)
    <module> (p.py:10)
Thread 11489 (idle): "worker"
    work (p.py:3)
    Thread.run (threading.py:982)
)";

const char* kFaulthandler = R"(Thread 0x00007fe4f88db6c0 (most recent call first):
  File "/tmp/x/p.py", line 3 in work
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007fe4f9630b80 (most recent call first):
  File "/tmp/x/p.py", line 5 in hang_here
  File "/tmp/x/p.py", line 8 in main
  File "/tmp/x/p.py", line 10 in <module>
)";

const char* kEuStack = R"(PID 11282 - process
TID 11282:
#0  0x00007f852071c545 clock_nanosleep@GLIBC_2.2.5
#1  0x00007f8520720e53 __nanosleep
#2  0x00007f8520720d8a sleep
#3  0x000055660c3a517a hang_here
#4  0x000055660c3a51a6 main
TID 11284:
#0  0x00007f8520720df2 pause
#1  0x000055660c3a516a work
)";

const char* kGdb = R"(Thread 2 (Thread 0x7f85206496c0 (LWP 11284) "n"):
#0  0x00007f8520720df2 in __libc_pause () at ../sysdeps/unix/sysv/linux/pause.c:29
#1  0x000055660c3a516a in work (a=0x0) at /tmp/x/n.c:3

Thread 1 (Thread 0x7f852064a740 (LWP 11282) "n"):
#0  0x00007f852071c545 in __GI___clock_nanosleep (clock_id=0) at ../sysdeps/clock_nanosleep.c:48
#3  0x000055660c3a517a in hang_here () at /tmp/x/n.c:4
#4  0x000055660c3a51a6 in main () at /tmp/x/n.c:5
)";

RankStacks Stacks(int rank, const std::string& tool, std::vector<ThreadStack> threads) {
  RankStacks r;
  r.rank = rank;
  r.tool = tool;
  r.threads = std::move(threads);
  return r;
}

}  // namespace

TEST_CASE("each stack tool's output is parsed into threads, frames and the main thread") {
  const auto py = ParsePySpy(kPySpy);
  REQUIRE(py.size() == 2);
  CHECK(py[0].main);
  CHECK_FALSE(py[1].main);
  REQUIRE(py[0].frames.size() == 3);
  CHECK(py[0].frames[0].function == "hang_here");
  CHECK(py[0].frames[0].file == "p.py");
  CHECK(py[0].frames[0].line == 5);
  CHECK(py[1].frames[1].function == "Thread.run");

  const auto fh = ParseFaulthandler(kFaulthandler);
  REQUIRE(fh.size() == 2);
  CHECK(fh[1].main);  // CPython lists the main thread last
  REQUIRE(fh[1].frames.size() == 3);
  CHECK(fh[1].frames[0].function == "hang_here");
  CHECK(fh[1].frames[0].file == "/tmp/x/p.py");
  CHECK(fh[1].frames[2].function == "<module>");

  const auto eu = ParseEuStack(kEuStack, 11282);
  REQUIRE(eu.size() == 2);
  CHECK(eu[0].main);
  CHECK(eu[0].frames[3].function == "hang_here");

  const auto gdb = ParseGdb(kGdb, 11282);
  REQUIRE(gdb.size() == 2);
  CHECK(gdb[1].main);
  CHECK(gdb[1].frames[1].function == "hang_here");
  CHECK(gdb[1].frames[1].file == "/tmp/x/n.c");
  CHECK(gdb[1].frames[1].line == 4);

  CHECK(ParsePySpy("py-spy: Permission denied (os error 13)\n").empty());
  CHECK(ParseEuStack("", 1).empty());
}

TEST_CASE("summaries group ranks by where they wait and name the odd one out") {
  auto where = [](std::vector<std::string> names, std::string file = "train.py") {
    ThreadStack t;
    t.main = true;
    for (auto& n : names) t.frames.push_back({n, file, 1});
    return std::vector<ThreadStack>{t};
  };
  CHECK(WhereWaiting(Stacks(0, "eu-stack", ParseEuStack(kEuStack, 11282))) ==
        "in `hang_here` <- `main`");  // the C library's sleep is skipped
  CHECK(WhereWaiting(Stacks(0, "py-spy", ParsePySpy(kPySpy))) ==
        "in `hang_here` <- `main` <- `<module>`");
  RankStacks none;
  none.error = "py-spy: Permission denied";
  CHECK(WhereWaiting(none) == "no stack (py-spy: Permission denied)");
  // A worker read while it starts: a thread with no frame yet (this once crashed crun).
  const auto starting = ParseFaulthandler(
      "Current thread 0x00007f0000000001 (most recent call first):\n  <no Python frame>\n");
  REQUIRE(starting.size() == 1);
  CHECK(WhereWaiting(Stacks(0, "faulthandler", starting)) ==
        "no frame in Current thread 0x00007f0000000001 (faulthandler)");
  CHECK(SuspectRanks({Stacks(0, "faulthandler", starting)}) == std::set<int>{0});
  CHECK(FormatStacks({Stacks(0, "faulthandler", starting)}, {}).find("rank 0") !=
        std::string::npos);

  std::vector<RankStacks> ranks;
  for (int r = 0; r < 8; ++r) {
    if (r == 5) {
      ranks.push_back(Stacks(r, "py-spy", where({"load_batch", "train_step"})));
    } else {
      auto t = where({"all_reduce", "wrapper", "train_step"});
      t[0].frames[0].file = "torch/distributed/distributed_c10d.py";
      ranks.push_back(Stacks(r, "py-spy", t));
    }
  }
  const auto summary = GroupSummary(ranks);
  REQUIRE(summary.size() == 2);
  CHECK(summary[0] == "rank 5: in `load_batch` <- `train_step`");
  CHECK(summary[1] == "ranks 0-4,6-7: in `all_reduce` <- `wrapper` <- `train_step`");
  CHECK(SuspectRanks(ranks) == std::set<int>{5});

  // Two ranks, one in a collective: the other is the suspect though the groups are equal.
  std::vector<RankStacks> two{ranks[0], ranks[5]};
  two[1].rank = 1;
  CHECK(SuspectRanks(two) == std::set<int>{1});
  // No collective and equal groups: nobody can be singled out.
  std::vector<RankStacks> even{Stacks(0, "py-spy", where({"a"})),
                               Stacks(1, "py-spy", where({"b"}))};
  CHECK(SuspectRanks(even) == std::set<int>{0, 1});

  CHECK(RankRanges({7, 0, 1, 2, 4, 5}) == "0-2,4-5,7");
  CHECK(RankRanges({3}) == "3");
  // Past 8 ranks, only one rank per place is printed in full.
  std::vector<RankStacks> many;
  for (int r = 0; r < 12; ++r) many.push_back(ranks[r % 8 == 5 ? 5 : 0]), many.back().rank = r;
  const std::string text = FormatStacks(many, {});
  CHECK(text.find("rank 0 (local rank") != std::string::npos);
  CHECK(text.find("rank 5 (local rank") != std::string::npos);
  CHECK(text.find("rank 6 (local rank") == std::string::npos);
  CHECK(text.find("in the same places as shown above") != std::string::npos);
  // JSON round trip (the form stacks travel in).
  const RankStacks back = StacksFromJson(StacksJson(ranks[5]));
  CHECK(WhereWaiting(back) == WhereWaiting(ranks[5]));
}

TEST_CASE("HangWatch declares a silent worker hung, not one that makes progress") {
  asio::io_context io;
  Child child({"sleep", "60"});
  auto counter = std::make_shared<std::uint64_t>(0);
  std::vector<WorkerProgress> declared;
  bool fired = false;
  HangWatch watch(io, milliseconds(300), [&](std::vector<WorkerProgress> p) {
    declared = std::move(p);
    fired = true;
  });
  watch.Watch(0, child.pid, counter);
  // Progress every 20 ms, 40 times: no hang while it lasts.
  int beats = 0;
  asio::steady_timer beat(io);
  std::function<void()> next = [&] {
    beat.expires_after(milliseconds(20));
    beat.async_wait([&](const boost::system::error_code& ec) {
      if (ec || beats == 40) return;
      ++beats;
      ++*counter;
      next();
    });
  };
  next();
  RunUntil(io, [&] { return fired; });
  CHECK(beats == 40);  // declared only once the progress had stopped
  REQUIRE(declared.size() == 1);
  CHECK(declared[0].hung);
  CHECK(declared[0].pid == child.pid);
  CHECK(declared[0].silent >= milliseconds(300));
  CHECK(declared[0].state == 'S');
  CHECK(declared[0].cause.rfind("no progress for ", 0) == 0);
}

TEST_CASE(
    "HangWatch with --hang-after-steps: a worker silent after its steps is hung at the "
    "pace's limit, long before --hang-timeout") {
  asio::io_context io;
  Child child({"sleep", "60"});
  auto counter = std::make_shared<std::uint64_t>(0);
  std::vector<WorkerProgress> declared;
  HangWatch watch(
      io, milliseconds(60'000), [&](std::vector<WorkerProgress> p) { declared = std::move(p); }, 3);
  watch.Watch(0, child.pid, counter);
  // A step every 20 ms, 20 times (a record is progress too), then silence.
  int steps = 0;
  asio::steady_timer beat(io);
  std::function<void()> next = [&] {
    beat.expires_after(milliseconds(20));
    beat.async_wait([&](const boost::system::error_code& ec) {
      if (ec || steps == 20) return;
      ++steps;
      ++*counter;
      watch.Stepped(0);
      next();
    });
  };
  next();
  RunUntil(io, [&] { return !declared.empty(); });
  CHECK(steps == 20);
  REQUIRE(declared.size() == 1);
  CHECK(declared[0].hung);
  CHECK(declared[0].limit >= kStepHangFloor);
  CHECK(declared[0].limit < milliseconds(60'000));
  CHECK(declared[0].silent >= declared[0].limit);
  CHECK(declared[0].cause.find("--hang-after-steps 3: its limit is") != std::string::npos);
  // Its silence counts as a step from now on: a stretch as long is no hang the next time.
  CHECK(watch.pace().longest() == declared[0].silent);
}

TEST_CASE("HangWatch: time its own loop was stalled is not the workers' silence") {
  asio::io_context io;
  Child child({"sleep", "60"});
  auto counter = std::make_shared<std::uint64_t>(0);
  std::vector<WorkerProgress> declared;
  HangWatch watch(io, milliseconds(300), [&](std::vector<WorkerProgress> p) { declared = p; });
  watch.Watch(0, child.pid, counter);
  // crun's loop is starved for three timeouts; the output that piled up meanwhile is read
  // 50 ms after (behind the late tick), then the worker goes on every 20 ms, 10 times.
  int beats = 0;
  asio::steady_timer beat(io);
  std::function<void()> next = [&] {
    beat.async_wait([&](const boost::system::error_code& ec) {
      if (ec || beats == 10) return;
      ++beats;
      ++*counter;
      beat.expires_after(milliseconds(20));
      next();
    });
  };
  asio::post(io, [&] {
    std::this_thread::sleep_for(milliseconds(900));  // the stimulus: crun not running
    beat.expires_after(milliseconds(50));
    next();
  });
  RunUntil(io, [&] { return !declared.empty(); });
  CHECK(beats == 10);  // not declared at the tick that came late, only once progress stopped
  REQUIRE(declared.size() == 1);
  CHECK(declared[0].hung);
  CHECK(declared[0].silent >= milliseconds(300));
}

TEST_CASE("HangWatch counts a stopped worker as making no progress, and says it was stopped") {
  asio::io_context io;
  Child child({"sleep", "60"});
  auto counter = std::make_shared<std::uint64_t>(0);
  std::vector<WorkerProgress> declared;
  HangWatch watch(io, milliseconds(300), [&](std::vector<WorkerProgress> p) { declared = p; });
  REQUIRE(::kill(child.pid, SIGSTOP) == 0);
  RunUntil(io, [&] { return crun::ProcessState(child.pid) == 'T'; });
  watch.Watch(0, child.pid, counter);
  // Its counter moves (as a child of it might write to its pipes), yet it is stopped.
  asio::steady_timer beat(io);
  std::function<void()> next = [&] {
    beat.expires_after(milliseconds(20));
    beat.async_wait([&](const boost::system::error_code& ec) {
      if (ec || !declared.empty()) return;
      ++*counter;
      next();
    });
  };
  next();
  RunUntil(io, [&] { return !declared.empty(); });
  CHECK(declared[0].hung);
  CHECK(declared[0].state == 'T');
  CHECK(declared[0].cause.find("stopped (T") != std::string::npos);
  ::kill(child.pid, SIGCONT);
}

TEST_CASE("HangWatch: an expired timer is a hang at once, Stop ends the watch") {
  asio::io_context io;
  Child a({"sleep", "60"});
  Child b({"sleep", "60"});
  std::vector<WorkerProgress> declared;
  HangWatch watch(io, milliseconds(0), [&](std::vector<WorkerProgress> p) { declared = p; });
  watch.Watch(0, a.pid, std::make_shared<std::uint64_t>(0));
  watch.Watch(1, b.pid, std::make_shared<std::uint64_t>(0));
  watch.Expire(1, "torchelastic timer 'x.py#3' of pid 7 expired 0.1 s ago");
  REQUIRE(declared.size() == 2);
  CHECK_FALSE(declared[0].hung);
  CHECK(declared[1].hung);
  CHECK(declared[1].cause == "torchelastic timer 'x.py#3' of pid 7 expired 0.1 s ago");
}

TEST_CASE("the file-timer server speaks torchelastic's protocol on a real named pipe") {
  crun::testing::TempDir dir("crun_file_timer");
  asio::io_context io;
  const std::string path = dir.path + "/timer.pipe";
  std::vector<pid_t> requests;
  std::vector<std::pair<pid_t, std::string>> expired;
  auto server = FileTimerServer::Open(
      io, path, [&](pid_t pid) { requests.push_back(pid); },
      [&](pid_t pid, std::string cause) {
        expired.push_back({pid, cause});
      });
  REQUIRE(server.ok());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  // As FileTimerClient sends: open non-blocking, one line, close.
  auto send = [&](const std::string& line) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
    ::close(fd);
  };
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char line[256];
  // A timer released before it expires, one that expires, and garbage between them.
  std::snprintf(
      line, sizeof line,
      R"({"version": 1, "pid": 41, "scope_id": "a.py#1", "expiration_time": %.3f, "signal": 9})"
      "\n",
      now + 0.2);
  send(line);
  send(R"({"version": 1, "pid": 41, "scope_id": "a.py#1", "expiration_time": -1, "signal": 0})"
       "\nnot json at all\n");
  std::snprintf(
      line, sizeof line,
      R"({"version": 1, "pid": 42, "scope_id": "b.py#7", "expiration_time": %.3f, "signal": 9})"
      "\n",
      now + 0.3);
  send(line);
  RunUntil(io, [&] { return !expired.empty(); });
  CHECK(requests == std::vector<pid_t>{41, 41, 42});
  CHECK((*server)->malformed() == 1);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].first == 42);
  CHECK(expired[0].second.find("'b.py#7'") != std::string::npos);
  CHECK((*server)->timers() == 0);
  server->reset();
  CHECK(::access(path.c_str(), F_OK) != 0);  // the pipe goes with the server
}

TEST_CASE("the file-timer server never replaces a file that is not a named pipe") {
  crun::testing::TempDir dir("crun_file_timer");
  asio::io_context io;
  const std::string path = dir.path + "/precious.txt";
  std::ofstream(path) << "someone's data\n";
  auto server = FileTimerServer::Open(
      io, path, [](pid_t) {}, [](pid_t, std::string) {});
  REQUIRE_FALSE(server.ok());
  CHECK(server.status().message().find(path) != std::string::npos);
  std::ifstream in(path);
  std::string content;
  std::getline(in, content);
  CHECK(content == "someone's data");
}

TEST_CASE("stacks of a real native process, by eu-stack or gdb") {
  const StackTools tools = FindStackTools("/usr/bin:/bin", {});
  if (tools.eu_stack.empty() && tools.gdb.empty()) {
    WARN("neither eu-stack nor gdb is installed: scripts/install-deps.sh installs both");
    return;
  }
  asio::io_context io;
  Child child({"sleep", "60"});
  RunUntil(io, [&] { return crun::ProcessState(child.pid) == 'S'; });
  std::vector<RankStacks> got;
  bool done = false;
  CaptureStacks(io, Children(), {{"h", 3, 1, child.pid, nullptr}}, tools, milliseconds(20'000),
                [&](std::vector<RankStacks> s) {
                  got = std::move(s);
                  done = true;
                });
  RunUntil(io, [&] { return done; });
  REQUIRE(got.size() == 1);
  INFO(got[0].error << "\n" << got[0].text);
  CHECK(got[0].rank == 3);
  CHECK((got[0].tool == "eu-stack" || got[0].tool == "gdb"));
  REQUIRE_FALSE(got[0].threads.empty());
  CHECK(got[0].threads[0].main);
  CHECK(FormatRankStacks(got[0]).find("main") != std::string::npos);
}

TEST_CASE("stacks of a real Python process through crun's hook, with no tool installed") {
  // The safe answer comes at the main thread's next safe point; a main thread that never gets
  // there (stood for here by blocking the safe signal; in a job, one blocked in C code) gets
  // the at-once one.
  const bool blocked = GENERATE(false, true);
  const StackSignals signals = HookSignals();
  crun::testing::TempDir dir("crun_python_hook");
  {
    std::ofstream(dir.path + "/sitecustomize.py") << PythonHookSource();
    std::ofstream(dir.path + "/parked.py") << "import signal, sys, time\n"
                                              "def parked_in_a_distinctive_place():\n"
                                              "    if sys.argv[1] == 'blocked':\n"
                                              "        signal.pthread_sigmask(signal.SIG_BLOCK, {"
                                           << signals.safe
                                           << "})\n"
                                              "    print('parked', flush=True)\n"
                                              "    time.sleep(60)\n"
                                              "parked_in_a_distinctive_place()\n";
  }
  asio::io_context io;
  auto pipe = StackPipe::Create(io);
  REQUIRE(pipe.ok());
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  ProcessSpec spec =
      Child::Spec({"python3", dir.path + "/parked.py", blocked ? "blocked" : "free"});
  spec.envp = {"PATH=/usr/bin:/bin", "PYTHONPATH=" + dir.path,
               "CRUN_STACKS_FD=" + std::to_string((*pipe)->child_fd()),
               "CRUN_STACKS_SAFE_SIGNAL=" + std::to_string(signals.safe),
               "CRUN_STACKS_SIGNAL=" + std::to_string(signals.at_once)};
  spec.inherit_fds = {(*pipe)->child_fd()};
  spec.stdout_fd = out[1];
  Child child(spec);
  ::close(out[1]);
  (*pipe)->CloseChildEnd();
  char buf[16] = {};
  REQUIRE(::read(out[0], buf, sizeof buf) > 0);  // it printed 'parked': the hook is in place
  ::close(out[0]);
  CHECK(Catches(child.pid, signals.safe));
  CHECK(Catches(child.pid, signals.at_once));
  auto capture = [&] {
    std::vector<RankStacks> got;
    bool done = false;
    CaptureStacks(io, Children(), {{"h", 0, 0, child.pid, pipe->get()}}, StackTools{},
                  milliseconds(20'000), [&](std::vector<RankStacks> s) {
                    got = std::move(s);
                    done = true;
                  });
    RunUntil(io, [&] { return done; });
    REQUIRE(got.size() == 1);
    return got[0];
  };
  // Asked twice: the same answer (nothing of the first one is left in the pipe).
  for (int ask = 0; ask < 2; ++ask) {
    const RankStacks got = capture();
    INFO("ask " << ask << ": " << got.error << "\n" << got.text);
    CHECK(got.tool == (blocked ? "faulthandler (signal handler)" : "faulthandler"));
    // The hook's own handler is not shown as where the worker was.
    CHECK(WhereWaiting(got) == "in `parked_in_a_distinctive_place` <- `<module>`");
    CHECK(got.text.find("crun-stacks-") == std::string::npos);
  }
  int status = 0;
  CHECK(::waitpid(child.pid, &status, WNOHANG) == 0);  // reading stacks stops nothing
}

TEST_CASE("the kernel's OOM-kill line gives the pid and the RSS") {
  const auto kill = crun::agent::ParseOomKillLine(
      "Memory cgroup out of memory: Killed process 12345 (python3) total-vm:1234567kB, "
      "anon-rss:96256kB, file-rss:2048kB, shmem-rss:0kB, UID:0 pgtables:400kB oom_score_adj:0");
  REQUIRE(kill);
  CHECK(kill->first == 12345);
  CHECK(kill->second == 98304);
  CHECK_FALSE(crun::agent::ParseOomKillLine("br0: port 2(p1) entered blocking state"));
  CHECK(crun::agent::OomKill{98304, "kernel log"}.Describe() ==
        "killed by the OOM killer (RSS 96 MiB, from the kernel log)");
  CHECK(crun::agent::OomKill{3 << 20, "kernel log"}.Describe() ==
        "killed by the OOM killer (RSS 3.0 GiB, from the kernel log)");
  CHECK(crun::agent::OomKill{-1, "cgroup's memory.events"}.Describe() ==
        "killed by the OOM killer (from the cgroup's memory.events)");
}
