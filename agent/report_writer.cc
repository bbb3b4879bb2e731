#include "agent/report_writer.h"

#include <cstdio>

#include "base/files.h"

namespace crun::agent {

void PublishReport(const ReportContext& context, const report::FailureReport& report,
                   const std::string& log_dir, const std::string& parent_error_file) {
  std::fputs(FormatReport(context, report).c_str(), stderr);
  const std::string json_path = log_dir + "/failure.json";
  if (WriteWholeFile(json_path, ReportJson(context, report).dump(2) + "\n")) {
    std::fprintf(stderr, "crun: failure report written to %s\n", json_path.c_str());
  } else {
    std::fprintf(stderr, "crun: cannot write the failure report to %s\n", json_path.c_str());
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
  if (!WriteWholeFile(parent_error_file, j.dump() + "\n")) {
    std::fprintf(stderr, "crun: cannot write the root cause to TORCHELASTIC_ERROR_FILE %s\n",
                 parent_error_file.c_str());
  }
}

}  // namespace crun::agent
