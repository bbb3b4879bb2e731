// A node's failure report (rendezvous/report/report.h) as JSON: what the etcd rendezvous keeps.
// The reference text is what protobuf 3.21's own printer (MessageToJsonString, field names
// preserved) wrote for the same report as crun.v1.FailureReport: the encoding etcd documents
// of earlier crun versions hold, which must read back unchanged.
#include <catch2/catch.hpp>

#include <string>

#include "rendezvous/report/report.h"

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

// Every field, for comparing reports.
std::string Fields(const FailureReport& r) {
  std::string out = r.host + "|" + r.node_id;
  for (const auto& w : r.failures) {
    out += "|" + w.time + "," + std::to_string(w.rank) + "," + std::to_string(w.local_rank) + "," +
           std::to_string(w.pid) + "," + (w.exit_code ? std::to_string(*w.exit_code) : "-") + "," +
           (w.signal ? std::to_string(*w.signal) : "-") + "," + w.message + "," + w.traceback +
           "," + w.error_file + "," + std::to_string(w.time_unix_ms) + "," + w.hang + "," + w.oom;
    for (const auto& line : w.stderr_tail) out += "," + line;
  }
  return out;
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
  CHECK(Fields(*back) == Fields(SampleReport()));
  const auto again = FromJson(ToJson(*back));
  REQUIRE(again.ok());
  CHECK(Fields(*again) == Fields(SampleReport()));
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

TEST_CASE("a report says its root cause in words and as an exit code", "[report]") {
  const FailureReport r = SampleReport();
  CHECK(crun::report::Describe(r) ==
        "rank 3 (local rank 1) on node-b failed with exit code 0: RuntimeError: boom");
  CHECK(crun::report::ExitCodeOf(r) == 1);  // exit code 0 is no shell code of a failure
  FailureReport killed;
  killed.host = "node-c";
  killed.failures.push_back(r.failures[1]);
  CHECK(crun::report::Describe(killed) ==
        "rank 2 (local rank 0) on node-c failed with a hang: no progress for 30.0 s");
  CHECK(crun::report::ExitCodeOf(killed) == 137);
  CHECK(crun::report::Describe(FailureReport{"node-d", {}, ""}) == "a worker on node-d failed");
  CHECK(crun::report::ExitCodeOf(FailureReport()) == 1);
}
