// The attempt's edge (agent/supervise/attempt_edge.h) and the start of a child into a cgroup, with
// real processes: a worker that leaves a child in its group and a grandchild in a session of its
// own, ended and reaped by the edge with and without a cgroup; a child started into a cgroup
// that was killed once (the kernel kills clone3(CLONE_INTO_CGROUP) children of such a cgroup
// at birth on Linux 6.x), which must still start. Cases that need a writable cgroup2 skip
// without one. Every wait has a deadline; nothing outlives its case.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/supervise/attempt_edge.h"
#include "agent/supervise/children.h"
#include "agent/supervise/exit_watcher.h"
#include "agent/supervise/spawn.h"
#include "agent/supervise/worker_cgroup.h"
#include "tests/unit/skip.h"
#include "tests/unit/temp_dir.h"

namespace {

namespace asio = boost::asio;
using namespace crun::agent;
using crun::testing::TempDir;
using namespace std::chrono_literals;

// Gone and reaped: no such process (a zombie of ours would still answer kill 0).
bool Gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

pid_t ReadPid(const std::string& path) {
  std::ifstream in(path);
  pid_t pid = 0;
  in >> pid;
  return pid;
}

// This process's children, as the worker group would own them.
ChildRegistry& Children() {
  static ChildRegistry children;
  return children;
}

struct Run {
  EdgeReport report;
  bool done = false;
  pid_t child = 0, daemon = 0;
};

// A worker whose plain child stays in its group and whose second child leaves it (setsid),
// each writing its pid; the worker exits once both are there and running sleep. Then the edge, as
// the agent runs it: SIGCHLD wakes it.
Run EndAttempt(std::unique_ptr<AttemptCgroup> cgroup) {
  TempDir dir;
  asio::io_context io;
  REQUIRE(BecomeSubreaper().ok());
  std::unique_ptr<AttemptEdge> edge;
  auto signals = ChildSignals::Open(io, [&] {
    Children().ReapOrphans();
    if (edge) edge->Notify();
  });
  REQUIRE(signals.ok());
  const std::string& d = dir.path;
  ProcessSpec spec;
  // "sh -c '...' &": a shell that writes its pid to NAME (atomically) and becomes a sleep.
  auto announced = [&](const std::string& name) {
    return "sh -c 'echo $$ > " + d + "/" + name + ".tmp; mv " + d + "/" + name + ".tmp " + d + "/" +
           name + "; exec sleep 600' &";
  };
  // The worker exits once both have become sleeps (their pid files exist and /proc says
  // "sleep"): before the exec, the edge would find, and name, a shell.
  auto slept = [&](const std::string& name) {
    return "[ \"$(cat /proc/$(cat " + d + "/" + name +
           " 2>/dev/null)/comm 2>/dev/null)\" = sleep ]";
  };
  spec.argv = {"/bin/sh", "-c",
               announced("child") + "setsid " + announced("daemon") + "until " + slept("child") +
                   " && " + slept("daemon") + "; do sleep 0.01; done"};
  if (cgroup) {
    spec.cgroup_fd = cgroup->fd();
    spec.cgroup_dir = cgroup->dir();
  }
  auto pid = SpawnProcess(spec, Children());
  REQUIRE(pid.ok());
  Run run;
  auto watcher = ExitWatcher::Watch(io, *pid, Children(), [&](ExitStatus s) {
    CHECK(s.success());
    run.child = ReadPid(d + "/child");
    run.daemon = ReadPid(d + "/daemon");
    edge = std::make_unique<AttemptEdge>(io, 3, std::vector<pid_t>{*pid}, std::move(cgroup),
                                         Children(), 10'000ms, [&](const EdgeReport& r) {
                                           run.report = r;
                                           run.done = true;
                                           io.stop();
                                         });
    edge->Start();
  });
  REQUIRE(watcher.ok());
  asio::steady_timer deadline(io, 30s);
  deadline.async_wait([&](const boost::system::error_code& ec) {
    if (!ec) io.stop();
  });
  io.run();
  return run;
}

void CheckEnded(const Run& run) {
  REQUIRE(run.done);
  CHECK(run.report.complete);
  CHECK(run.report.attempt == 3);
  CHECK(run.report.in_groups == 1);   // the plain child
  CHECK(run.report.left_count == 1);  // the one in its own session
  REQUIRE(run.report.left.size() == 1);
  CHECK(run.report.left[0] == "pid " + std::to_string(run.daemon) + " (sleep)");
  CHECK(Gone(run.child));
  CHECK(Gone(run.daemon));
  CHECK(Children().Orphans().empty());
}

std::unique_ptr<WorkerCgroup> WorkerCgroupOrSkip() {
  auto cgroup = WorkerCgroup::Create();
  if (!cgroup.ok()) {
    crun::testing::Skip(("no cgroup for the workers: " + cgroup.status().message()).c_str());
  }
  return std::move(cgroup).value();
}

TEST_CASE("edge: a worker's child and daemonised grandchild are ended and reaped (no cgroup)",
          "[edge]") {
  CheckEnded(EndAttempt(nullptr));
}

TEST_CASE("edge: the same in the attempt's own cgroup, which is removed", "[edge][may-skip]") {
  auto parent = WorkerCgroupOrSkip();
  auto attempt = AttemptCgroup::Create(*parent, 0);
  REQUIRE(attempt.ok());
  const std::string dir = (*attempt)->dir();
  CheckEnded(EndAttempt(std::move(attempt).value()));
  CHECK(::access(dir.c_str(), F_OK) != 0);
}

TEST_CASE("edge: a child started into a cgroup that was killed once still starts",
          "[edge][may-skip]") {
  auto parent = WorkerCgroupOrSkip();
  auto attempt = AttemptCgroup::Create(*parent, 0);
  REQUIRE(attempt.ok());
  (*attempt)->KillAll();  // empty: only the kernel's kill counter moves
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", "exit 3"};
  spec.cgroup_fd = (*attempt)->fd();
  spec.cgroup_dir = (*attempt)->dir();
  for (int i = 0; i < 3; ++i) {  // the first may be reborn outside clone3; the rest start so
    auto pid = SpawnProcess(spec, Children());
    REQUIRE(pid.ok());
    int status = 0;
    REQUIRE(::waitpid(*pid, &status, 0) == *pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 3);
  }
}

TEST_CASE("edge: crun's cgroup goes with every cgroup below it, whatever made it",
          "[edge][may-skip]") {
  // The warm template's cgroup ("warm") and one a worker made below its attempt's: each holds
  // a live process when crun's cgroup is removed (a leftover "warm" was crun's leak).
  auto parent = WorkerCgroupOrSkip();
  const std::string dir = parent->dir();
  auto warm = AttemptCgroup::Create(*parent, std::string("warm"));
  REQUIRE(warm.ok());
  auto attempt = AttemptCgroup::Create(*parent, 1);
  REQUIRE(attempt.ok());
  const std::string inner = (*attempt)->dir() + "/made-by-a-worker";
  REQUIRE(::mkdir(inner.c_str(), 0755) == 0);
  std::vector<pid_t> pids;
  for (const std::string& into : {(*warm)->dir(), inner}) {
    ProcessSpec spec;
    spec.argv = {"/bin/sleep", "60"};
    spec.cgroup_dir = into;
    auto pid = SpawnProcess(spec, Children());
    REQUIRE(pid.ok());
    pids.push_back(*pid);
    std::ofstream(into + "/cgroup.procs") << *pid;  // where clone3 could not put it there
  }
  warm->reset();     // the template's end: its rmdir fails while the process lives
  attempt->reset();  // likewise, for the cgroup below it
  CHECK(::access(dir.c_str(), F_OK) == 0);
  parent.reset();
  CHECK(::access(dir.c_str(), F_OK) != 0);
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);  // already dead: no wait
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
  }
}

TEST_CASE(
    "edge: a cgroup an earlier crun with this pid left is never reused: removed when "
    "empty, left alone in use",
    "[edge][may-skip]") {
  // A SIGKILLed crun whose guard died with it (or is still ending what was in it) leaves
  // crun-<pid>, and pids come round again: made here by hand, with an attempt's below it.
  std::string name;
  { name = WorkerCgroupOrSkip()->dir(); }
  REQUIRE(::access(name.c_str(), F_OK) != 0);
  const std::string attempt = name + "/attempt-4";
  REQUIRE(::mkdir(name.c_str(), 0755) == 0);
  REQUIRE(::mkdir(attempt.c_str(), 0755) == 0);
  auto first = WorkerCgroup::Create();
  REQUIRE(first.ok());
  CHECK((*first)->dir() == name + "-1");     // a name of its own, which no old guard ends
  CHECK(::access(name.c_str(), F_OK) != 0);  // the empty leftover is gone
  first->reset();

  // In use (a live process below it): not this crun's to end.
  const std::string busy = name + "/attempt-5";
  REQUIRE(::mkdir(name.c_str(), 0755) == 0);
  REQUIRE(::mkdir(busy.c_str(), 0755) == 0);
  ProcessSpec spec;
  spec.argv = {"/bin/sleep", "60"};
  spec.cgroup_dir = busy;
  auto pid = SpawnProcess(spec, Children());
  REQUIRE(pid.ok());
  {
    std::ofstream procs(busy + "/cgroup.procs");
    procs << *pid;
    procs.flush();
    REQUIRE(procs.good());
  }
  auto second = WorkerCgroup::Create();
  REQUIRE(second.ok());
  CHECK((*second)->dir() == name + "-1");
  CHECK(::access(busy.c_str(), F_OK) == 0);
  second->reset();
  CHECK(::access(busy.c_str(), F_OK) == 0);  // still: its process lives
  REQUIRE(KillAndRemoveCgroup(name));
  int status = 0;
  REQUIRE(::waitpid(*pid, &status, 0) == *pid);
  CHECK(WIFSIGNALED(status));
}

}  // namespace
