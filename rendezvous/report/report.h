// A node's failure report: which of its workers failed, how and why, first in time first. The
// one model every part of crun uses: the agent fills it as its workers end
// (agent/failures/attempt_failures.h) and prints it (agent/failures/report_format.h), the
// rendezvous core decides on it (rendezvous/service), the etcd rendezvous keeps it as the JSON
// below, and only the gRPC adapter and the agent's session convert it to crun.v1.FailureReport on
// the wire.
//
// Each encoding of the model is defined here once, or in one place for its format: the words
// (Describe, DescribeEnd), the shell code (ExitCodeOf), the stored JSON (ToJson, FromJson),
// failure.json's entries (FileJson), the protobuf message (report_proto.h, its own library)
// and the printed block (agent/failures/report_format.h, which says exits with DescribeEnd's
// words). tests/unit/report_cases.h is the table every one of them is tested against. Plain C++ and
// nlohmann_json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace crun::report {

struct WorkerFailure {
  std::string time;  // ISO 8601, UTC (may be empty: time_unix_ms says it)
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  std::optional<int> exit_code;  // one of the two, or neither when unknown
  std::optional<int> signal;
  std::string message;    // the error file's ("ValueError: ..."), if it wrote one
  std::string traceback;  // the same file's Python call stack
  std::vector<std::string> stderr_tail;
  std::string error_file;
  std::int64_t time_unix_ms = 0;
  std::string hang;  // not empty: it hung, and this says how
  std::string oom;   // not empty: the OOM killer ended it
  // Not empty: crun stopped it as a slow rank (--straggler-action restart), and this says how
  // slow ("2.4x the others' median compute time per step (steps 40-49)").
  std::string slow;
  // The error file's JSON as the worker wrote it (TORCHELASTIC_ERROR_FILE passes it on). Only
  // the node that read the file has it: ToJson and the wire leave it out.
  std::string error_json;

  bool operator==(const WorkerFailure&) const = default;
};

struct FailureReport {
  std::string host;
  std::vector<WorkerFailure> failures;  // first in time first: the root cause
  std::string node_id;
  // Its attempt had made no progress when it failed: no rank had sent a step heartbeat and the
  // attempt had run for less than --progress-after. Crash loops count these (docs/health.md).
  bool before_progress = false;

  bool operator==(const FailureReport&) const = default;
};

// Exit codes a scheduler acts on (docs/health.md): values no shell, signal, Python or sysexits
// convention gives a worker. crun exits with one only for these outcomes.
// The job itself is broken (a crash loop): do not requeue it.
inline constexpr int kExitDoNotRequeue = 86;
// This node failed its health check: requeue the job without it.
inline constexpr int kExitRequeueWithoutNode = 87;

// How a worker ended, in words: "exit code 2", "signal 9 (SIGKILL)" (base/signals.h), with the
// OOM killer's part when it had one ("signal 9 (SIGKILL) (killed by the OOM killer)"), or
// "a hang: no progress for 30.0 s" when crun stopped it for one.
std::string DescribeEnd(const WorkerFailure& f);
// The root cause in one line, as every backend's restart reason and exit message says it:
// "rank 3 (local rank 1) on node-b failed with exit code 2: ValueError: ...". A report that
// names no host leaves out " on <host>".
std::string Describe(const FailureReport& report);
// Describe without the error file's message: "rank 3 (local rank 1) on node-b failed with exit
// code 2".
std::string DescribeCause(const FailureReport& report);
// The failure's last Python line: the error file's message, else the exception line that ends
// the last traceback in its stderr tail ("ValueError: bad batch"); "" when it reported none.
std::string LastTracebackLine(const WorkerFailure& f);
// How the report's root cause failed, for telling a crash loop: its end (exit code, signal or
// a hang) and LastTracebackLine, without rank or host. Failures with equal ways failed "the
// same way"; "" for a report without failures.
std::string FailureWay(const FailureReport& report);
// Whether the worker wrote an error file (its message, traceback or JSON are in the record).
bool WroteErrorFile(const WorkerFailure& f);
// The failure's time_unix_ms in ISO 8601, UTC, to the millisecond: "2026-11-26T12:00:00.250Z".
std::string IsoTime(const WorkerFailure& f);
// The shell code of the report's first failure (exit code, or 128 + signal); 1 if none.
int ExitCodeOf(const FailureReport& report);

// The report as a JSON object: field names as in proto/crun/v1/rendezvous.proto, in its order,
// fields at their default left out (but an exit code of 0, which is not "no exit"),
// time_unix_ms as a string. That is the shape protobuf's JSON mapping gives the message, which
// earlier crun versions wrote into etcd: their documents read back unchanged. Bytes that are
// not UTF-8 (a worker's stderr) are written as U+FFFD.
std::string ToJson(const FailureReport& report);
// Back from ToJson's text (time_unix_ms as a string or a number); kInvalidArgument naming what
// is wrong for anything else.
StatusOr<FailureReport> FromJson(std::string_view text);
// failure.json's "failures": the layout users' tools read (docs/cli.md), one object a failure
// with every key present: time (IsoTime), host (the report's, else `default_host`), rank,
// local_rank, pid, exit_code and signal (one of them null; the signal by name), error_file,
// hang and oom when it had them, then message and traceback when it wrote an error file, else
// stderr_tail. Derived from the same field list as ToJson.
nlohmann::json FileJson(const FailureReport& report, const std::string& default_host);

}  // namespace crun::report
