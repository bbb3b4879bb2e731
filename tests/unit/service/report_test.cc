// A node's failure report (rendezvous/report/report.h) in each of its encodings, against the
// one table of tests/unit/report_cases.h: its words, its shell code, the JSON the etcd
// rendezvous keeps and failure.json's entries. The stored JSON's reference is what protobuf
// 3.21's own printer (MessageToJsonString, field names preserved) wrote for the same report as
// crun.v1.FailureReport: the encoding etcd documents of earlier crun versions hold, which must
// read back unchanged.
#include <catch2/catch.hpp>

#include <string>

#include "rendezvous/report/report.h"
#include "tests/unit/report_cases.h"

namespace {

using crun::report::FailureReport;
using crun::report::FromJson;
using crun::report::ToJson;
using crun::report::WorkerFailure;

// Captured from protobuf 3.21's MessageToJsonString (preserve_proto_field_names) for the report
// SampleReport() builds.
const char* const kProtobufJson =
    R"({"host":"node-b","failures":[{"rank":3,"local_rank":1,"pid":4242,"exit_code":0,)"
    R"("message":"RuntimeError: boom","traceback":"Traceback (most recent call last):\n  x",)"
    R"("stderr_tail":["line one","café \"quoted\""],)"
    R"("error_file":"/tmp/e/attempt_0/3/error.json","time_unix_ms":"1764012345678"},)"
    R"({"rank":2,"signal":9,"time_unix_ms":"1764012345999","hang":"no progress for 30.0 s",)"
    R"("oom":"killed by the OOM killer"}],"node_id":"node-b#4242"})";

FailureReport SampleReport() {
  FailureReport r;
  r.node_id = "node-b#4242";
  r.host = "node-b";
  WorkerFailure w;
  w.time_unix_ms = 1764012345678;
  w.rank = 3;
  w.local_rank = 1;
  w.pid = 4242;
  w.exit_code = 0;  // set, so written: exit code 0 is not "no exit"
  w.message = "RuntimeError: boom";
  w.traceback = "Traceback (most recent call last):\n  x";
  w.stderr_tail = {"line one", "café \"quoted\""};
  w.error_file = "/tmp/e/attempt_0/3/error.json";
  r.failures.push_back(w);
  WorkerFailure v;
  v.rank = 2;
  v.signal = 9;
  v.time_unix_ms = 1764012345999;
  v.hang = "no progress for 30.0 s";
  v.oom = "killed by the OOM killer";
  r.failures.push_back(v);
  return r;
}

}  // namespace

TEST_CASE("a failure report is written as protobuf's JSON printer wrote it", "[report]") {
  CHECK(ToJson(SampleReport()) == kProtobufJson);
  CHECK(ToJson(FailureReport()) == "{}");
  // The error file's own JSON stays on the node that read it.
  auto local = SampleReport();
  local.failures[0].error_json = R"({"message": "only here"})";
  CHECK(ToJson(local) == kProtobufJson);
}

TEST_CASE("a failure report reads back, from either writer", "[report]") {
  const auto back = FromJson(kProtobufJson);
  REQUIRE(back.ok());
  CHECK(*back == SampleReport());
  const auto again = FromJson(ToJson(*back));
  REQUIRE(again.ok());
  CHECK(*again == SampleReport());
  CHECK(again->failures[0].exit_code == 0);
  CHECK_FALSE(again->failures[0].signal);
  CHECK(again->failures[1].signal == 9);
  CHECK_FALSE(again->failures[1].exit_code);
  // protobuf's parser takes an int64 as a number too.
  const auto number = FromJson(R"({"failures":[{"time_unix_ms":1764012345678}]})");
  REQUIRE(number.ok());
  CHECK(number->failures[0].time_unix_ms == 1764012345678);
  CHECK_FALSE(number->failures[0].exit_code);
  CHECK_FALSE(number->failures[0].signal);
}

TEST_CASE("a worker's bytes that are not UTF-8 do not break the report", "[report]") {
  FailureReport r;
  r.failures.emplace_back().stderr_tail = {"bad \xff byte"};
  const auto text = ToJson(r);
  CHECK(text == R"({"failures":[{"stderr_tail":["bad )"
                "\xef\xbf\xbd"
                R"( byte"]}]})");
  const auto back = FromJson(text);
  REQUIRE(back.ok());
  CHECK(back->failures[0].stderr_tail[0] == "bad \xef\xbf\xbd byte");
}

TEST_CASE("anything but a failure report is refused", "[report]") {
  for (const char* text :
       {"", "not json", "[]", "3", R"({"host":3})", R"({"failures":[{"rank":"three"}]})",
        R"({"failures":{}})", R"({"failures":[7]})", R"({"failures":[{"time_unix_ms":"12x"}]})",
        R"({"failures":[{"stderr_tail":"one line"}]})"}) {
    INFO(text);
    const auto got = FromJson(text);
    REQUIRE_FALSE(got.ok());
    CHECK(got.status().code() == crun::StatusCode::kInvalidArgument);
    CHECK_THAT(got.status().message(), Catch::Contains("not a failure report"));
  }
}

TEST_CASE("each encoding of a report, against the one table", "[report]") {
  for (const auto& c : crun::testing::ReportCases()) {
    INFO(c.name);
    CHECK(crun::report::Describe(c.report) == c.describe);
    CHECK(crun::report::ExitCodeOf(c.report) == c.exit_code);
    CHECK(ToJson(c.report) == c.stored);
    const auto back = FromJson(c.stored);
    REQUIRE(back.ok());
    CHECK(*back == c.report);
    CHECK(crun::report::FileJson(c.report, "this-host").dump() == c.file);
  }
}

TEST_CASE("failure.json keeps a report's every field that the stored JSON has", "[report]") {
  // A field added to the model and to one layout only fails here: every key of the stored
  // JSON is in the file's entry too, under the same name (time_unix_ms as "time").
  for (const auto& c : crun::testing::ReportCases()) {
    INFO(c.name);
    const auto stored = nlohmann::json::parse(c.stored);
    const auto file = crun::report::FileJson(c.report, "this-host");
    if (!stored.contains("failures")) continue;
    REQUIRE(file.size() == stored["failures"].size());
    for (std::size_t i = 0; i < file.size(); ++i) {
      for (const auto& [key, value] : stored["failures"][i].items()) {
        INFO(key);
        CHECK(file[i].contains(key == "time_unix_ms" ? "time" : key));
      }
    }
  }
}

TEST_CASE("how a failure failed: its end and its last Python line, without rank or host",
          "[report]") {
  namespace report = crun::report;
  using crun::testing::kReportNoon;
  using crun::testing::ReportFailure;
  struct Row {
    const char* name;
    report::WorkerFailure failure;
    std::string last_line;
    std::string way;
  };
  auto exit_with = [](int code, std::vector<std::string> tail, std::string message = "") {
    auto f = ReportFailure(3, 1, 9, kReportNoon);
    f.exit_code = code;
    f.stderr_tail = std::move(tail);
    f.message = std::move(message);
    return f;
  };
  auto hung = ReportFailure(3, 1, 9, kReportNoon);
  hung.signal = SIGTERM;
  hung.hang = "no progress for 31.2 s";
  auto slow = ReportFailure(3, 1, 9, kReportNoon);
  slow.signal = SIGTERM;
  slow.slow = "2.4x the others' median compute time per step (steps 40-49)";
  auto killed = ReportFailure(0, 0, 9, kReportNoon);
  killed.signal = SIGKILL;
  const std::vector<Row> rows = {
      {"the error file's message wins",
       exit_with(1, {"Traceback (most recent call last):", "KeyError: 'x'"}, "ValueError: bad"),
       "ValueError: bad", "exit code 1: ValueError: bad"},
      {"the exception line of the last traceback",
       exit_with(2, {"Traceback (most recent call last):", "  File \"a.py\", line 1", "OSError: a",
                     "", "During handling of the above exception, another exception occurred:", "",
                     "Traceback (most recent call last):", "  File \"a.py\", line 3",
                     "    raise RuntimeError('b')", "RuntimeError: b", "exiting"}),
       "RuntimeError: b", "exit code 2: RuntimeError: b"},
      {"no traceback: the end alone", exit_with(3, {"step 10", "bye"}), "", "exit code 3"},
      {"a traceback cut before its last line",
       exit_with(1, {"Traceback (most recent call last):", "  File \"a.py\", line 1"}), "",
       "exit code 1"},
      {"a hang is one way, however long", hung, "", "a hang"},
      {"a slow rank is one way, however slow", slow, "", "a slow rank"},
      {"a signal", killed, "", "signal 9 (SIGKILL)"},
  };
  for (const auto& row : rows) {
    INFO(row.name);
    CHECK(report::LastTracebackLine(row.failure) == row.last_line);
    report::FailureReport r;
    r.host = "node-" + std::string(row.name).substr(0, 3);  // the host is no part of the way
    r.failures = {row.failure};
    CHECK(report::FailureWay(r) == row.way);
  }
  CHECK(report::FailureWay(report::FailureReport{}).empty());
}
