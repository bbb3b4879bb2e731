// The failure report: which rank failed first (the root cause), on which host, how, and why:
// the traceback from its torchelastic error file (written by @record), or else the last lines
// of its stderr. Other failures follow. Pure formatting; reading the error file is the only I/O.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/hangs/hang_report.h"
#include "agent/supervise/exit_status.h"
#include "rendezvous/report/report.h"

namespace crun::agent {

// The report model is rendezvous/report/report.h: a node's FailureReport, one WorkerFailure per
// failed worker. These read it as the agent does.

// How the worker ended, as a record says it (no exit code and no signal reads as exit code 0).
ExitStatus ExitOf(const report::WorkerFailure& f);
void SetExit(report::WorkerFailure& f, ExitStatus exit);
using report::WroteErrorFile;
// Now, as a record's time_unix_ms.
std::int64_t NowUnixMs();

struct ReportContext {
  std::string run_id;
  std::string host;  // for a report that names none
  std::string role;
  std::string entrypoint;  // the script or program
  int attempt = 0;
  int max_restarts = 0;
  // How Python workers' interpreter was chosen; when the root cause could not import a module,
  // the report names it and PYTHON_EXEC. Empty for native programs.
  std::string interpreter;
  const HangReport* hang = nullptr;  // the attempt's hang, when it had one
};

// Reads a torchelastic error file (either format) into `f`'s message, traceback and
// error_json; false (and `f` unchanged) when it is absent, unreadable or not one.
bool ReadErrorFile(const std::string& path, report::WorkerFailure& f);

// `report.failures` sorted by time: the first is the root cause. A report that names no host
// is the context's.
// The printed report: the root cause's block, the hang, then a line for each other failure.
std::string FormatReport(const ReportContext& context, const report::FailureReport& report);
// failure.json: the context, the failures as report::FileJson writes them, and the hang.
nlohmann::json ReportJson(const ReportContext& context, const report::FailureReport& report);

}  // namespace crun::agent
