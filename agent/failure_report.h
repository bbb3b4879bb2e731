// The failure report: which rank failed first (the root cause), on which host, how, and why:
// the traceback from its torchelastic error file (written by @record), or else the last lines
// of its stderr. Other failures follow. Pure formatting; reading the error file is the only I/O.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/hangs/hang_report.h"
#include "agent/supervise/process.h"
#include "rendezvous/report/report.h"

namespace crun::agent {

struct ErrorFileContent {
  std::string message;    // "ValueError: intentional failure on rank 0"
  std::string traceback;  // the worker's Python call stack
  nlohmann::json raw;
};

// One failed worker. Everything the report shows is in here (read when the worker exited),
// so a record can travel to other nodes and be printed there the same way.
struct FailureRecord {
  std::string host;
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  ExitStatus exit;
  std::chrono::system_clock::time_point when;
  std::string error_file;                 // path given to the worker
  std::optional<ErrorFileContent> error;  // what it wrote there, if anything
  std::vector<std::string> stderr_tail;   // last lines of its stderr
  // Not empty: the worker hung and crun stopped it ("no progress for 30.0 s", "torchelastic
  // timer 'x.py#12' expired 0.1 s ago"); `exit` is then how it ended once stopped.
  std::string hang;
  // Not empty: the kernel's OOM killer ended it ("killed by the OOM killer (RSS 1.2 GiB, from
  // the kernel log)").
  std::string oom;
};

struct ReportContext {
  std::string run_id;
  std::string host;  // for records that name none
  std::string role;
  std::string entrypoint;  // the script or program
  int attempt = 0;
  int max_restarts = 0;
  // How Python workers' interpreter was chosen; when the root cause could not import a module,
  // the report names it and PYTHON_EXEC. Empty for native programs.
  std::string interpreter;
  const HangReport* hang = nullptr;  // the attempt's hang, when it had one
};

// The records as the report other nodes read (rendezvous/report/report.h), and back: every
// field a record shows travels (the error file's raw JSON does not).
report::FailureReport ToReport(const std::string& node_id,
                               const std::vector<FailureRecord>& failures);
std::vector<FailureRecord> FromReport(const report::FailureReport& report);

// Reads a torchelastic error file (either format); nullopt when absent or unreadable.
std::optional<ErrorFileContent> ReadErrorFile(const std::string& path);

// `failures` sorted by time: the first is the root cause.
std::string FormatReport(const ReportContext& context, const std::vector<FailureRecord>& failures);
nlohmann::json ReportJson(const ReportContext& context, const std::vector<FailureRecord>& failures);

}  // namespace crun::agent
