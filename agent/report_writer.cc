#include "agent/report_writer.h"

#include <cstdio>

#include "base/files.h"

namespace crun::agent {

void PublishReport(const ReportContext& context, const std::vector<FailureRecord>& report,
                   const std::string& log_dir, const std::string& parent_error_file) {
  std::fputs(FormatReport(context, report).c_str(), stderr);
  const std::string json_path = log_dir + "/failure.json";
  if (WriteWholeFile(json_path, ReportJson(context, report).dump(2) + "\n")) {
    std::fprintf(stderr, "crun: failure report written to %s\n", json_path.c_str());
  } else {
    std::fprintf(stderr, "crun: cannot write the failure report to %s\n", json_path.c_str());
  }
  if (parent_error_file.empty() || report.empty()) return;
  // As torchrun does: the root cause's error file, with its exit code as errorCode.
  const FailureRecord& root = report.front();
  nlohmann::json j;
  if (root.error && root.error->raw.is_object() && root.error->raw["message"].is_object()) {
    j = root.error->raw;
  } else {
    j["message"]["message"] = root.error ? root.error->message : FormatReport(context, report);
  }
  j["message"]["errorCode"] = root.exit.ShellCode();
  if (!WriteWholeFile(parent_error_file, j.dump() + "\n")) {
    std::fprintf(stderr, "crun: cannot write the root cause to TORCHELASTIC_ERROR_FILE %s\n",
                 parent_error_file.c_str());
  }
}

}  // namespace crun::agent
