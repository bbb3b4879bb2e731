// The agent's reading of the one failure report model (rendezvous/report/report.h): error
// files of both torchelastic formats into a record, exits both ways, the printed and JSON
// report with the report's host, and the root cause passed on through
// TORCHELASTIC_ERROR_FILE as the worker wrote it. Real files in a temporary directory.
#include <catch2/catch.hpp>

#include <signal.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "agent/failures/report_format.h"
#include "agent/failures/report_publish.h"
#include "base/files.h"
#include "tests/unit/report_cases.h"
#include "tests/unit/temp_dir.h"

namespace {

using namespace crun::agent;
namespace report = crun::report;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// 2026-11-26T12:00:00.250Z
constexpr std::int64_t kNoon = 1795694400250;

report::FailureReport TwoFailures() {
  report::FailureReport r;
  r.host = "node-b";
  auto& root = r.failures.emplace_back();
  root.rank = 3;
  root.local_rank = 1;
  root.pid = 4242;
  root.time_unix_ms = kNoon;
  SetExit(root, ExitStatus{false, 2});
  root.stderr_tail = {"Traceback (most recent call last):", "ValueError: bad batch"};
  auto& other = r.failures.emplace_back();
  other.rank = 2;
  other.pid = 4241;
  other.time_unix_ms = kNoon + 1000;
  SetExit(other, ExitStatus{true, SIGTERM});
  return r;
}

ReportContext Context() {
  ReportContext c;
  c.run_id = "r1";
  c.host = "this-host";
  c.role = "default";
  c.entrypoint = "train.py";
  c.attempt = 1;
  c.max_restarts = 3;
  return c;
}

TEST_CASE("failure report: an exit is an exit code or a signal, never both", "[report]") {
  report::WorkerFailure f;
  CHECK(ExitOf(f).ShellCode() == 0);  // neither: exit code 0
  SetExit(f, ExitStatus{true, SIGKILL});
  CHECK(f.signal == SIGKILL);
  CHECK_FALSE(f.exit_code.has_value());
  CHECK(ExitOf(f).Describe() == "signal 9 (SIGKILL)");
  SetExit(f, ExitStatus{false, 0});
  CHECK(f.exit_code == 0);  // an exit code of 0 is one
  CHECK_FALSE(f.signal.has_value());
  CHECK(ExitOf(f).success());
}

TEST_CASE("failure report: error files of both formats are read into the record", "[report]") {
  crun::testing::TempDir dir;
  report::WorkerFailure f;
  SECTION("the nested format, with the Python call stack") {
    const std::string path = dir.path + "/error.json";
    REQUIRE(crun::WriteWholeFile(path,
                                 R"({"message": {"message": "ValueError: bad", "extraInfo": )"
                                 R"({"py_callstack": "File x.py, line 3", "timestamp": "1"}}})"));
    REQUIRE(ReadErrorFile(path, f));
    CHECK(f.message == "ValueError: bad");
    CHECK(f.traceback == "File x.py, line 3");
    CHECK(nlohmann::json::parse(f.error_json)["message"]["extraInfo"]["timestamp"] == "1");
    CHECK(WroteErrorFile(f));
  }
  SECTION("the flat format") {
    const std::string path = dir.path + "/error.json";
    REQUIRE(crun::WriteWholeFile(path, R"({"message": "RuntimeError: flat"})"));
    REQUIRE(ReadErrorFile(path, f));
    CHECK(f.message == "RuntimeError: flat");
    CHECK(f.traceback.empty());
  }
  SECTION("absent, not JSON, or without a message: the record is left as it was") {
    f.message = "kept";
    CHECK_FALSE(ReadErrorFile("", f));
    CHECK_FALSE(ReadErrorFile(dir.path + "/none.json", f));
    REQUIRE(crun::WriteWholeFile(dir.path + "/garbage.json", "{not json"));
    CHECK_FALSE(ReadErrorFile(dir.path + "/garbage.json", f));
    REQUIRE(crun::WriteWholeFile(dir.path + "/other.json", R"({"error": 1})"));
    CHECK_FALSE(ReadErrorFile(dir.path + "/other.json", f));
    CHECK(f.message == "kept");
    CHECK(f.error_json.empty());
  }
}

TEST_CASE("failure report: printed and as JSON with the report's host, root cause first",
          "[report]") {
  const auto r = TwoFailures();
  const std::string text = FormatReport(Context(), r);
  CHECK_THAT(text,
             Catch::Contains("crun: train.py FAILED (run r1, attempt 1, 3 restarts allowed)"));
  CHECK_THAT(text, Catch::Contains("  time      : 2026-11-26T12:00:00.250Z\n"));
  CHECK_THAT(text, Catch::Contains("  host      : node-b\n"));
  CHECK_THAT(text, Catch::Contains("  rank      : 3 (local rank 1, role default)\n"));
  CHECK_THAT(text, Catch::Contains("  exit      : exit code 2\n"));
  CHECK_THAT(text, Catch::Contains("  error file: <none written>\n"));
  CHECK_THAT(text, Catch::Contains("    ValueError: bad batch\n"));
  CHECK_THAT(text, Catch::Contains("  rank 2 on node-b (local rank 0, pid 4241): signal 15 "
                                   "(SIGTERM) at 2026-11-26T12:00:01.250Z\n"));

  const auto j = ReportJson(Context(), r);
  REQUIRE(j["failures"].size() == 2);
  CHECK(j["failures"][0]["host"] == "node-b");
  CHECK(j["failures"][0]["exit_code"] == 2);
  CHECK(j["failures"][0]["signal"].is_null());
  CHECK(j["failures"][0]["stderr_tail"].size() == 2);
  CHECK(j["failures"][1]["exit_code"].is_null());
  CHECK(j["failures"][1]["signal"] == "SIGTERM");

  auto unnamed = r;
  unnamed.host.clear();
  CHECK_THAT(FormatReport(Context(), unnamed), Catch::Contains("  host      : this-host\n"));
  CHECK(ReportJson(Context(), unnamed)["failures"][0]["host"] == "this-host");
}

TEST_CASE("failure report: a CUDA out-of-memory traceback is named as the cause", "[report]") {
  const std::string line =
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4096.00 GiB. GPU 0 has a "
      "total capacity of 79.19 GiB";
  auto r = TwoFailures();
  // From the last stderr lines (no error file), PyTorch 2.x's words and 1.13's.
  for (const std::string& last :
       std::vector<std::string>{line, "RuntimeError: CUDA out of memory. Tried to allocate"}) {
    r.failures[0].stderr_tail = {"Traceback (most recent call last):", "  x = torch.empty(n)",
                                 last};
    CHECK_THAT(FormatReport(Context(), r),
               Catch::Contains("  cause     : CUDA out of memory on its GPU (from its traceback: " +
                               last + ")\n"));
  }
  // From the error file's message.
  r.failures[0].stderr_tail.clear();
  r.failures[0].message = line;
  CHECK_THAT(FormatReport(Context(), r), Catch::Contains("(from its traceback: " + line + ")"));
  // PyTorch's long message is cut after its first 160 characters.
  r.failures[0].message = line + std::string(300, 'x');
  CHECK_THAT(FormatReport(Context(), r),
             Catch::Contains("(from its traceback: " + r.failures[0].message.substr(0, 160) +
                             " ...)\n"));
  // Any other error, or another rank's CUDA OOM, names no such cause.
  r.failures[0].message = "ValueError: bad batch";
  r.failures[1].stderr_tail = {line};
  CHECK_THAT(FormatReport(Context(), r), !Catch::Contains("cause     :"));
}

TEST_CASE("failure report: TORCHELASTIC_ERROR_FILE gets the worker's file and its exit code",
          "[report]") {
  crun::testing::TempDir dir;
  auto r = TwoFailures();
  const std::string parent = dir.path + "/parent.json";
  SECTION("the worker's own error file, as it wrote it, with errorCode") {
    const std::string path = dir.path + "/error.json";
    REQUIRE(crun::WriteWholeFile(
        path, R"({"message": {"message": "ValueError: bad", "extraInfo": {"timestamp": "7"}}})"));
    REQUIRE(ReadErrorFile(path, r.failures[0]));
    PublishReport(Context(), r, dir.path, parent);
    const auto j = nlohmann::json::parse(Read(parent));
    CHECK(j["message"]["message"] == "ValueError: bad");
    CHECK(j["message"]["extraInfo"]["timestamp"] == "7");
    CHECK(j["message"]["errorCode"] == 2);
  }
  SECTION("no error file: the printed report, with the signal's shell code") {
    std::swap(r.failures[0], r.failures[1]);
    PublishReport(Context(), r, dir.path, parent);
    const auto j = nlohmann::json::parse(Read(parent));
    CHECK_THAT(j["message"]["message"].get<std::string>(), Catch::Contains("FAILED"));
    CHECK(j["message"]["errorCode"] == 128 + SIGTERM);
  }
  CHECK(nlohmann::json::parse(Read(dir.path + "/failure.json"))["failures"].size() == 2);
}

TEST_CASE("failure report: a worker's bytes that are not UTF-8 are published, replaced",
          "[report]") {
  crun::testing::TempDir dir;
  auto r = TwoFailures();
  r.failures[0].stderr_tail = {"bad \xff byte"};
  const std::string parent = dir.path + "/parent_error.json";
  PublishReport(Context(), r, dir.path, parent);
  const auto file = nlohmann::json::parse(Read(dir.path + "/failure.json"));
  CHECK(file["failures"][0]["stderr_tail"][0] == "bad \xef\xbf\xbd byte");
  const auto j = nlohmann::json::parse(Read(parent));
  CHECK_THAT(j["message"]["message"].get<std::string>(), Catch::Contains("bad \xef\xbf\xbd byte"));
}

TEST_CASE("failure report: printed and in failure.json as the table says, for every row",
          "[report]") {
  for (const auto& c : crun::testing::ReportCases()) {
    INFO(c.name);
    const std::string text = FormatReport(Context(), c.report);
    const auto j = ReportJson(Context(), c.report);
    CHECK(j["failures"] == nlohmann::json::parse(c.file));
    if (c.report.failures.empty()) {
      CHECK_THAT(text, Catch::Contains("Other failures: none"));
      continue;
    }
    const auto& root = c.report.failures.front();
    CHECK_THAT(text, Catch::Contains("  time      : " + report::IsoTime(root) + "\n"));
    CHECK_THAT(text, Catch::Contains("  host      : " +
                                     (c.report.host.empty() ? "this-host" : c.report.host) + "\n"));
    CHECK_THAT(text,
               Catch::Contains("  rank      : " + std::to_string(root.rank) + " (local rank " +
                               std::to_string(root.local_rank) + ", role default)\n"));
    CHECK_THAT(text, Catch::Contains("  exit      : " + ExitOf(root).Describe()));
    if (!root.hang.empty()) CHECK_THAT(text, Catch::Contains("  hang      : " + root.hang + "\n"));
    if (!root.oom.empty()) CHECK_THAT(text, Catch::Contains(root.oom));
    if (!root.message.empty()) {
      CHECK_THAT(text, Catch::Contains("  error     : " + root.message + "\n"));
    }
    for (const auto& line : root.stderr_tail) CHECK_THAT(text, Catch::Contains("    " + line));
  }
}

}  // namespace
