#include "agent/failures/report_publish.h"

#include "base/fd_writer.h"
#include "base/files.h"

namespace crun::agent {

void PublishReport(const ReportContext& context, const report::FailureReport& report,
                   const std::string& log_dir, const std::string& parent_error_file) {
  // Through crun's stderr writer, never dropped: it waits for a stalled reader without
  // holding up the agent (base/fd_writer.h).
  FdWriter& err = FdWriter::Stderr();
  err.Write(FormatReport(context, report));
  const std::string json_path = log_dir + "/failure.json";
  // A worker's bytes that are not UTF-8 (its stderr, its error file) are written as U+FFFD.
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  if (WriteWholeFile(json_path, ReportJson(context, report).dump(2, ' ', false, kReplace) + "\n")) {
    err.Write("crun: failure report written to " + json_path + "\n");
  } else {
    err.Write("crun: cannot write the failure report to " + json_path + "\n");
  }
  if (parent_error_file.empty() || report.failures.empty()) return;
  // As torchrun does: the root cause's error file, with its exit code as errorCode.
  const report::WorkerFailure& root = report.failures.front();
  nlohmann::json j = nlohmann::json::parse(root.error_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j["message"].is_object()) {
    j = nlohmann::json::object();
    j["message"]["message"] = WroteErrorFile(root) ? root.message : FormatReport(context, report);
  }
  j["message"]["errorCode"] = ExitOf(root).ShellCode();
  if (!WriteWholeFile(parent_error_file, j.dump(-1, ' ', false, kReplace) + "\n")) {
    err.Write("crun: cannot write the root cause to TORCHELASTIC_ERROR_FILE " + parent_error_file +
              "\n");
  }
}

void PublishFailures(const JobEnd& end, const report::FailureReport& report) {
  ReportContext c = end.context;
  c.hang = end.failures.HangBehind(report);
  PublishReport(c, report, end.log_dir, end.parent_error_file);
}

void PublishOutcome(const JobEnd& end, const JobOutcome& outcome) {
  if (outcome.success) return;
  const auto& own = end.failures.report();
  if (!own.failures.empty() && outcome.root_node_id == end.node_id) {
    PublishFailures(end, own);
    // A decision beyond the root cause's own failure (a crash loop) is said after it.
    if (outcome.exit_code == report::kExitDoNotRequeue) {
      FdWriter::Stderr().Write("crun: the job failed: " + outcome.reason + "\n");
    }
  } else if (!outcome.root_report.failures.empty()) {
    PublishFailures(end, outcome.root_report);
    FdWriter::Stderr().Write("crun: the job failed on node '" + outcome.root_node_id +
                             "': " + outcome.reason + "\n");
  } else if (outcome.exit_code == report::kExitRequeueWithoutNode &&
             outcome.root_node_id == end.node_id) {
    FdWriter::Stderr().Write("crun: " + outcome.reason + " (exit code " +
                             std::to_string(outcome.exit_code) +
                             ": requeue without this node; docs/health.md)\n");
  } else {
    FdWriter::Stderr().Write("crun: the job failed: " + outcome.reason + "\n");
  }
}

}  // namespace crun::agent
