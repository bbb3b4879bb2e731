// A node's failure report as the etcd rendezvous keeps it: protobuf's JSON mapping of
// crun.v1.FailureReport, written by hand since crun's messages are lite. The reference text is
// what protobuf 3.21's own printer (MessageToJsonString, field names preserved) wrote for the
// same report, the encoding crun used before its messages were lite.
#include <catch2/catch.hpp>

#include <string>

#include "agent/rendezvous/failure_proto.h"

namespace {

using crun::agent::FailureReportFromJson;
using crun::agent::FailureReportToJson;

// Captured from protobuf 3.21's MessageToJsonString (preserve_proto_field_names) for the report
// SampleReport() builds.
const char* const kProtobufJson =
    R"({"host":"node-b","failures":[{"rank":3,"local_rank":1,"pid":4242,"exit_code":0,)"
    R"("message":"RuntimeError: boom","traceback":"Traceback (most recent call last):\n  x",)"
    R"("stderr_tail":["line one","café \"quoted\""],)"
    R"("error_file":"/tmp/e/attempt_0/3/error.json","time_unix_ms":"1764012345678"},)"
    R"({"rank":2,"signal":9,"time_unix_ms":"1764012345999","hang":"no progress for 30.0 s",)"
    R"("oom":"killed by the OOM killer"}],"node_id":"node-b#4242"})";

crun::v1::FailureReport SampleReport() {
  crun::v1::FailureReport r;
  r.set_node_id("node-b#4242");
  r.set_host("node-b");
  auto* w = r.add_failures();
  w->set_time_unix_ms(1764012345678);
  w->set_rank(3);
  w->set_local_rank(1);
  w->set_pid(4242);
  w->set_exit_code(0);  // set, so written: exit code 0 is not "no exit"
  w->set_message("RuntimeError: boom");
  w->set_traceback("Traceback (most recent call last):\n  x");
  w->add_stderr_tail("line one");
  w->add_stderr_tail("café \"quoted\"");
  w->set_error_file("/tmp/e/attempt_0/3/error.json");
  auto* v = r.add_failures();
  v->set_rank(2);
  v->set_signal(9);
  v->set_time_unix_ms(1764012345999);
  v->set_hang("no progress for 30.0 s");
  v->set_oom("killed by the OOM killer");
  return r;
}

}  // namespace

TEST_CASE("a failure report is written as protobuf's JSON printer wrote it", "[failure_proto]") {
  CHECK(FailureReportToJson(SampleReport()) == kProtobufJson);
  CHECK(FailureReportToJson(crun::v1::FailureReport()) == "{}");
}

TEST_CASE("a failure report reads back, from either writer", "[failure_proto]") {
  const auto back = FailureReportFromJson(kProtobufJson);
  REQUIRE(back.has_value());
  CHECK(back->SerializeAsString() == SampleReport().SerializeAsString());
  const auto again = FailureReportFromJson(FailureReportToJson(*back));
  REQUIRE(again.has_value());
  CHECK(again->SerializeAsString() == SampleReport().SerializeAsString());
  CHECK(again->failures(0).exit_case() == crun::v1::WorkerFailure::kExitCode);
  CHECK(again->failures(1).exit_case() == crun::v1::WorkerFailure::kSignal);
  // protobuf's parser takes an int64 as a number too.
  const auto number = FailureReportFromJson(R"({"failures":[{"time_unix_ms":1764012345678}]})");
  REQUIRE(number.has_value());
  CHECK(number->failures(0).time_unix_ms() == 1764012345678);
  CHECK(number->failures(0).exit_case() == crun::v1::WorkerFailure::EXIT_NOT_SET);
}

TEST_CASE("a worker's bytes that are not UTF-8 do not break the report", "[failure_proto]") {
  crun::v1::FailureReport r;
  r.add_failures()->add_stderr_tail("bad \xff byte");
  const auto text = FailureReportToJson(r);
  CHECK(text == R"({"failures":[{"stderr_tail":["bad )"
                "\xef\xbf\xbd"
                R"( byte"]}]})");
  const auto back = FailureReportFromJson(text);
  REQUIRE(back.has_value());
  CHECK(back->failures(0).stderr_tail(0) == "bad \xef\xbf\xbd byte");
}

TEST_CASE("anything but a failure report is refused", "[failure_proto]") {
  for (const char* text :
       {"", "not json", "[]", "3", R"({"host":3})", R"({"failures":[{"rank":"three"}]})",
        R"({"failures":{}})", R"({"failures":[7]})", R"({"failures":[{"time_unix_ms":"12x"}]})",
        R"({"failures":[{"stderr_tail":"one line"}]})"}) {
    INFO(text);
    CHECK_FALSE(FailureReportFromJson(text).has_value());
  }
}
