// One table of failure reports, and what each encoding of the model makes of each
// (rendezvous/report/report.h): the words (Describe), the shell code (ExitCodeOf), the stored
// JSON (ToJson; equal to what protobuf's own JSON printer writes for crun.v1.FailureReport,
// which tests/unit/service/proto_messages_test.cc checks row by row) and failure.json's
// entries (FileJson). The report tests, the protobuf tests and the agent's printed report all
// read this table, so a field or a spelling that changes in one encoding and not another fails
// one of them.
#pragma once

#include <signal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/report/report.h"

namespace crun::testing {

struct ReportCase {
  const char* name;
  report::FailureReport report;
  std::string describe;  // Describe
  int exit_code;         // ExitCodeOf
  std::string stored;    // ToJson
  std::string file;      // FileJson(report, "this-host").dump()
};

// 2026-11-26T12:00:00.250Z
constexpr std::int64_t kReportNoon = 1795694400250;

inline report::WorkerFailure ReportFailure(int rank, int local_rank, int pid,
                                           std::int64_t unix_ms) {
  report::WorkerFailure f;
  f.rank = rank;
  f.local_rank = local_rank;
  f.pid = pid;
  f.time_unix_ms = unix_ms;
  return f;
}

inline std::vector<ReportCase> ReportCases() {
  std::vector<ReportCase> rows;
  {
    ReportCase c{"an error file, and a second failure by a signal", {}, "", 0, "", ""};
    c.report.host = "node-b";
    c.report.node_id = "node-b#4242";
    auto root = ReportFailure(3, 1, 4242, kReportNoon);
    root.exit_code = 2;
    root.message = "ValueError: bad batch";
    root.traceback = "Traceback (most recent call last):\n  x";
    root.error_file = "/tmp/e/attempt_0/3/error.json";
    auto other = ReportFailure(2, 0, 4241, kReportNoon + 1000);
    other.signal = SIGTERM;
    c.report.failures = {root, other};
    c.describe = "rank 3 (local rank 1) on node-b failed with exit code 2: ValueError: bad batch";
    c.exit_code = 2;
    c.stored = R"({"host":"node-b","failures":[{"rank":3,"local_rank":1,"pid":4242,"exit_code":2,)"
               R"("message":"ValueError: bad batch",)"
               R"("traceback":"Traceback (most recent call last):\n  x",)"
               R"("error_file":"/tmp/e/attempt_0/3/error.json","time_unix_ms":"1795694400250"},)"
               R"({"rank":2,"pid":4241,"signal":15,"time_unix_ms":"1795694401250"}],)"
               R"("node_id":"node-b#4242"})";
    c.file =
        R"([{"error_file":"/tmp/e/attempt_0/3/error.json","exit_code":2,"host":"node-b",)"
        R"("local_rank":1,"message":"ValueError: bad batch","pid":4242,"rank":3,"signal":null,)"
        R"("time":"2026-11-26T12:00:00.250Z",)"
        R"("traceback":"Traceback (most recent call last):\n  x"},)"
        R"({"error_file":"","exit_code":null,"host":"node-b","local_rank":0,"pid":4241,"rank":2,)"
        R"("signal":"SIGTERM","stderr_tail":[],"time":"2026-11-26T12:00:01.250Z"}])";
    rows.push_back(c);
  }
  {
    ReportCase c{"killed by a signal, its stderr the only words", {}, "", 0, "", ""};
    c.report.host = "node-a";
    auto f = ReportFailure(1, 1, 77, kReportNoon);
    f.signal = SIGKILL;
    f.stderr_tail = {"step 10", "café \"quoted\""};
    c.report.failures = {f};
    c.describe = "rank 1 (local rank 1) on node-a failed with signal 9 (SIGKILL)";
    c.exit_code = 137;
    c.stored = R"({"host":"node-a","failures":[{"rank":1,"local_rank":1,"pid":77,"signal":9,)"
               R"("stderr_tail":["step 10","café \"quoted\""],"time_unix_ms":"1795694400250"}]})";
    c.file =
        R"([{"error_file":"","exit_code":null,"host":"node-a","local_rank":1,"pid":77,"rank":1,)"
        R"("signal":"SIGKILL","stderr_tail":["step 10","café \"quoted\""],)"
        R"("time":"2026-11-26T12:00:00.250Z"}])";
    rows.push_back(c);
  }
  {
    ReportCase c{"ended by the OOM killer", {}, "", 0, "", ""};
    c.report.host = "node-a";
    auto f = ReportFailure(0, 0, 5, kReportNoon);
    f.signal = SIGKILL;
    f.oom = "killed by the OOM killer (cgroup's memory.events)";
    c.report.failures = {f};
    c.describe =
        "rank 0 (local rank 0) on node-a failed with signal 9 (SIGKILL) (killed by the OOM "
        "killer (cgroup's memory.events))";
    c.exit_code = 137;
    c.stored = R"({"host":"node-a","failures":[{"pid":5,"signal":9,"time_unix_ms":"1795694400250",)"
               R"x("oom":"killed by the OOM killer (cgroup's memory.events)"}]})x";
    c.file = R"([{"error_file":"","exit_code":null,"host":"node-a","local_rank":0,)"
             R"x("oom":"killed by the OOM killer (cgroup's memory.events)","pid":5,"rank":0,)x"
             R"("signal":"SIGKILL","stderr_tail":[],"time":"2026-11-26T12:00:00.250Z"}])";
    rows.push_back(c);
  }
  {
    ReportCase c{"stopped by crun for a hang", {}, "", 0, "", ""};
    c.report.host = "node-c";
    auto f = ReportFailure(5, 1, 9, kReportNoon);
    f.signal = SIGTERM;
    f.hang = "no progress for 30.0 s";
    c.report.failures = {f};
    c.describe = "rank 5 (local rank 1) on node-c failed with a hang: no progress for 30.0 s";
    c.exit_code = 143;
    c.stored = R"({"host":"node-c","failures":[{"rank":5,"local_rank":1,"pid":9,"signal":15,)"
               R"("time_unix_ms":"1795694400250","hang":"no progress for 30.0 s"}]})";
    c.file =
        R"([{"error_file":"","exit_code":null,"hang":"no progress for 30.0 s","host":"node-c",)"
        R"("local_rank":1,"pid":9,"rank":5,"signal":"SIGTERM","stderr_tail":[],)"
        R"("time":"2026-11-26T12:00:00.250Z"}])";
    rows.push_back(c);
  }
  {
    ReportCase c{"stopped by crun as a slow rank", {}, "", 0, "", ""};
    c.report.host = "node-b";
    auto f = ReportFailure(3, 1, 8, kReportNoon);
    f.signal = SIGTERM;
    f.slow = "2.4x the others' median compute time per step (steps 40-49)";
    c.report.failures = {f};
    c.describe =
        "rank 3 (local rank 1) on node-b failed with a slow rank: 2.4x the others' median "
        "compute time per step (steps 40-49)";
    c.exit_code = 143;
    c.stored = R"({"host":"node-b","failures":[{"rank":3,"local_rank":1,"pid":8,"signal":15,)"
               R"("time_unix_ms":"1795694400250",)"
               R"x("slow":"2.4x the others' median compute time per step (steps 40-49)"}]})x";
    c.file = R"([{"error_file":"","exit_code":null,"host":"node-b","local_rank":1,"pid":8,)"
             R"("rank":3,"signal":"SIGTERM",)"
             R"x("slow":"2.4x the others' median compute time per step (steps 40-49)",)x"
             R"("stderr_tail":[],"time":"2026-11-26T12:00:00.250Z"}])";
    rows.push_back(c);
  }
  {
    // An exit code of 0 is written (it is not "no exit"), and is no shell code of a failure.
    ReportCase c{"exit code 0, with the worker's own time text", {}, "", 0, "", ""};
    c.report.host = "node-a";
    auto f = ReportFailure(4, 0, 11, kReportNoon);
    f.exit_code = 0;
    f.time = "2026-11-26T12:00:00Z";
    c.report.failures = {f};
    c.describe = "rank 4 (local rank 0) on node-a failed with exit code 0";
    c.exit_code = 1;
    c.stored = R"({"host":"node-a","failures":[{"time":"2026-11-26T12:00:00Z","rank":4,"pid":11,)"
               R"("exit_code":0,"time_unix_ms":"1795694400250"}]})";
    c.file = R"([{"error_file":"","exit_code":0,"host":"node-a","local_rank":0,"pid":11,"rank":4,)"
             R"("signal":null,"stderr_tail":[],"time":"2026-11-26T12:00:00.250Z"}])";
    rows.push_back(c);
  }
  {
    ReportCase c{"neither an exit code nor a signal, and no host", {}, "", 0, "", ""};
    c.report.failures = {ReportFailure(2, 2, 0, 0)};
    c.describe = "rank 2 (local rank 2) failed with exit code 0";
    c.exit_code = 1;
    c.stored = R"({"failures":[{"rank":2,"local_rank":2}]})";
    c.file =
        R"([{"error_file":"","exit_code":0,"host":"this-host","local_rank":2,"pid":0,"rank":2,)"
        R"("signal":null,"stderr_tail":[],"time":"1970-01-01T00:00:00.000Z"}])";
    rows.push_back(c);
  }
  {
    ReportCase c{"a Python traceback in stderr, before any progress", {}, "", 0, "", ""};
    c.report.host = "node-a";
    c.report.before_progress = true;
    auto f = ReportFailure(6, 2, 12, kReportNoon);
    f.exit_code = 1;
    f.stderr_tail = {"rank 6: starting",
                     "Traceback (most recent call last):", "  File \"t.py\", line 1, in main",
                     "    import nope", "ModuleNotFoundError: No module named 'nope'"};
    c.report.failures = {f};
    c.describe = "rank 6 (local rank 2) on node-a failed with exit code 1";
    c.exit_code = 1;
    c.stored = R"({"host":"node-a","failures":[{"rank":6,"local_rank":2,"pid":12,"exit_code":1,)"
               R"("stderr_tail":["rank 6: starting","Traceback (most recent call last):",)"
               R"("  File \"t.py\", line 1, in main","    import nope",)"
               R"("ModuleNotFoundError: No module named 'nope'"],)"
               R"("time_unix_ms":"1795694400250"}],"before_progress":true})";
    c.file = R"([{"error_file":"","exit_code":1,"host":"node-a","local_rank":2,"pid":12,"rank":6,)"
             R"("signal":null,"stderr_tail":["rank 6: starting",)"
             R"("Traceback (most recent call last):","  File \"t.py\", line 1, in main",)"
             R"("    import nope","ModuleNotFoundError: No module named 'nope'"],)"
             R"("time":"2026-11-26T12:00:00.250Z"}])";
    rows.push_back(c);
  }
  {
    ReportCase c{"no failure in it", {}, "", 0, "", ""};
    c.report.host = "node-d";
    c.describe = "a worker on node-d failed";
    c.exit_code = 1;
    c.stored = R"({"host":"node-d"})";
    c.file = "[]";
    rows.push_back(c);
  }
  return rows;
}

}  // namespace crun::testing
