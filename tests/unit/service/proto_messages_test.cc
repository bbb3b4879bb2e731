// The gRPC adapter's conversions (rendezvous/service/proto_messages.h): what an agent sends
// reaches the engine whole, and what the engine says reaches the wire whole, including the
// distinctions the wire makes (a oneof's unset case, an unset optional, wire defaults).
#include <catch2/catch.hpp>

#include <variant>

#include <fstream>
#include <memory>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/type_resolver_util.h>

#include "rendezvous/report/report.h"
#include "rendezvous/service/proto_messages.h"
#include "tests/unit/report_cases.h"

namespace {

namespace msg = crun::rdzv::msg;
namespace v1 = crun::v1;
using crun::rdzv::EncodeAssignmentHead;
using crun::rdzv::EncodeMembers;
using crun::rdzv::FromProto;
using crun::rdzv::ToProto;

// Through bytes, as gRPC carries it.
template <class M>
M OverTheWire(const M& m) {
  std::string bytes;
  REQUIRE(m.SerializeToString(&bytes));
  M out;
  REQUIRE(out.ParseFromString(bytes));
  return out;
}

// Protobuf's own JSON printer for crun.v1 messages, on the schema's descriptors (the build
// writes them: tests/CMakeLists.txt), with field names as the .proto spells them.
class JsonPrinter {
 public:
  JsonPrinter() {
    std::ifstream in(CRUN_V1_DESCRIPTORS, std::ios::binary);
    google::protobuf::FileDescriptorSet files;
    REQUIRE(files.ParseFromIstream(&in));
    for (const auto& file : files.file()) REQUIRE(pool_.BuildFile(file) != nullptr);
    resolver_.reset(google::protobuf::util::NewTypeResolverForDescriptorPool(kUrlPrefix, &pool_));
  }

  template <class M>
  std::string Print(const M& message) const {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    std::string out;
    const auto status =
        google::protobuf::util::BinaryToJsonString(resolver_.get(),
                                                   std::string(kUrlPrefix) + "/" +
                                                       message.GetTypeName(),
                                                   message.SerializeAsString(), &out, options);
    REQUIRE(status.ok());
    return out;
  }

 private:
  static constexpr const char* kUrlPrefix = "type.googleapis.com";
  google::protobuf::DescriptorPool pool_;
  std::unique_ptr<google::protobuf::util::TypeResolver> resolver_;
};

}  // namespace

TEST_CASE("a join reaches the engine with every field", "[proto]") {
  v1::AgentMessage m;
  auto* j = m.mutable_join();
  j->set_protocol_version(1);
  j->set_run_id("job7");
  j->set_service_host("10.0.0.1");
  j->set_unhealthy("disk: /logs has 1 MiB free");
  auto* n = j->mutable_node();
  n->set_node_id("node-a#1");
  n->set_host("node-a");
  n->add_addresses("10.0.0.2");
  n->add_addresses("fd00::2");
  n->set_nproc(8);
  n->set_requested_rank(0);  // set to 0 is not unset
  n->set_incarnation(0xFEEDFACECAFEBEEFULL);
  for (std::uint32_t port : {4000u, 0u, 70000u, 65535u}) n->add_ports(port);
  auto* s = j->mutable_settings();
  s->set_min_nodes(2);
  s->set_max_nodes(4);
  s->set_join_timeout_ms(1234);
  s->set_max_restarts(3);  // last-call and heartbeat times left 0: the defaults

  auto converted = FromProto(OverTheWire(m));
  REQUIRE(converted.has_value());
  const auto& join = std::get<msg::Join>(*converted);
  CHECK(join.protocol_version == 1);
  CHECK(join.run_id == "job7");
  CHECK(join.service_host == "10.0.0.1");
  CHECK(join.unhealthy == "disk: /logs has 1 MiB free");
  CHECK(join.node.node_id == "node-a#1");
  CHECK(join.node.host == "node-a");
  CHECK(join.node.addresses == std::vector<std::string>{"10.0.0.2", "fd00::2"});
  CHECK(join.node.nproc == 8);
  CHECK(join.node.requested_rank == std::optional<int>(0));
  CHECK(join.node.incarnation == 0xFEEDFACECAFEBEEFULL);
  // What cannot be a port (0, above 65535) is dropped: the round then says that node
  // reserved fewer than its contracts need.
  CHECK(join.node.ports == std::vector<std::uint16_t>{4000, 65535});
  CHECK(join.settings.min_nodes == 2);
  CHECK(join.settings.max_nodes == 4);
  CHECK(join.settings.join_timeout == crun::rdzv::Millis(1234));
  CHECK(join.settings.last_call_timeout == crun::rdzv::kDefaultLastCallTimeout);
  CHECK(join.settings.heartbeat_timeout == crun::rdzv::kDefaultHeartbeatTimeout);
  CHECK(join.settings.max_restarts == 3);

  n->clear_requested_rank();
  CHECK_FALSE(std::get<msg::Join>(*FromProto(m)).node.requested_rank.has_value());
}

TEST_CASE("a failure report keeps exit code, signal, or neither", "[proto]") {
  v1::AgentMessage m;
  auto* r = m.mutable_workers_failed();
  r->set_host("node-b");
  r->set_node_id("b");
  auto* coded = r->add_failures();
  coded->set_rank(3);
  coded->set_local_rank(1);
  coded->set_pid(4242);
  coded->set_exit_code(0);  // a oneof set to 0 is still set
  coded->set_time("2026-11-24T03:00:00.000Z");
  coded->set_time_unix_ms(1795489200000);
  coded->set_message("ValueError: boom");
  coded->set_traceback("Traceback ...");
  coded->add_stderr_tail("line 1");
  coded->add_stderr_tail("line 2");
  coded->set_error_file("/tmp/err.json");
  r->add_failures()->set_signal(9);
  r->add_failures();  // neither

  auto converted = FromProto(OverTheWire(m));
  REQUIRE(converted.has_value());
  const auto& report = std::get<msg::FailureReport>(*converted);
  CHECK(report.host == "node-b");
  CHECK(report.node_id == "b");
  REQUIRE(report.failures.size() == 3);
  const auto& f = report.failures[0];
  CHECK(f.rank == 3);
  CHECK(f.local_rank == 1);
  CHECK(f.pid == 4242);
  CHECK(f.exit_code == std::optional<int>(0));
  CHECK_FALSE(f.signal.has_value());
  CHECK(f.time == "2026-11-24T03:00:00.000Z");
  CHECK(f.time_unix_ms == 1795489200000);
  CHECK(f.message == "ValueError: boom");
  CHECK(f.traceback == "Traceback ...");
  CHECK(f.stderr_tail == std::vector<std::string>{"line 1", "line 2"});
  CHECK(f.error_file == "/tmp/err.json");
  CHECK(report.failures[1].signal == std::optional<int>(9));
  CHECK_FALSE(report.failures[1].exit_code.has_value());
  CHECK_FALSE(report.failures[2].signal.has_value());
  CHECK_FALSE(report.failures[2].exit_code.has_value());

  // And back out, as the root cause of a finished job: the same three cases on the wire.
  msg::JobFinished finished;
  finished.reason = "r";
  finished.root_cause = report;
  finished.exit_code = 3;
  const auto wire = OverTheWire(ToProto(finished));
  REQUIRE(wire.has_finished());
  const auto& root = wire.finished().root_cause();
  CHECK(wire.finished().exit_code() == 3);
  CHECK(root.node_id() == "b");
  REQUIRE(root.failures_size() == 3);
  CHECK(root.failures(0).exit_case() == v1::WorkerFailure::kExitCode);
  CHECK(root.failures(0).stderr_tail_size() == 2);
  CHECK(root.failures(0).time_unix_ms() == 1795489200000);
  CHECK(root.failures(1).exit_case() == v1::WorkerFailure::kSignal);
  CHECK(root.failures(1).signal() == 9);
  CHECK(root.failures(2).exit_case() == v1::WorkerFailure::EXIT_NOT_SET);
  msg::JobFinished succeeded;
  succeeded.success = true;
  CHECK_FALSE(OverTheWire(ToProto(succeeded)).finished().has_root_cause());
}

TEST_CASE("the small agent messages, and one of no known kind", "[proto]") {
  v1::AgentMessage m;
  m.mutable_heartbeat()->set_sequence(77);
  CHECK(std::get<msg::Heartbeat>(*FromProto(m)).sequence == 77);
  CHECK(std::get<msg::Heartbeat>(*FromProto(m)).snapshots.step == -1);  // none said
  m.mutable_heartbeat()->set_snapshot_bytes(4096);
  m.mutable_heartbeat()->set_snapshot_step(0);
  m.mutable_heartbeat()->set_disk_step(9);
  const auto beat = std::get<msg::Heartbeat>(*FromProto(m));
  CHECK(beat.snapshots.bytes == 4096);
  CHECK(beat.snapshots.step == 0);
  CHECK(beat.snapshots.disk_step == 9);
  m.mutable_workers_succeeded();
  CHECK(std::holds_alternative<msg::WorkersSucceeded>(*FromProto(m)));
  m.mutable_leave()->set_reason("bye");
  CHECK(std::get<msg::Leave>(*FromProto(m)).reason == "bye");
  m.Clear();
  CHECK_FALSE(FromProto(m).has_value());
}

TEST_CASE("the engine's messages reach the wire with every field", "[proto]") {
  msg::Assignment assignment;
  assignment.round = 2;
  assignment.group_rank = 1;
  assignment.group_world_size = 3;
  assignment.base_rank = 8;
  assignment.world_size = 24;
  assignment.master_addr = "10.0.0.1";
  assignment.master_port = 29500;
  assignment.restart_count = 1;
  assignment.durable_service = true;
  assignment.waited_for_nodes_ms = 5100;
  assignment.members = std::make_shared<std::vector<msg::RoundMember>>(
      std::vector<msg::RoundMember>{{"node-a", "10.0.0.2", 2, {4000, 4001}},
                                    {"node-b", "fd00::3", 1, {}}});
  const auto a = OverTheWire(ToProto(assignment));
  REQUIRE(a.has_assignment());
  CHECK(a.assignment().round() == 2);
  CHECK(a.assignment().group_rank() == 1);
  CHECK(a.assignment().group_world_size() == 3);
  CHECK(a.assignment().base_rank() == 8);
  CHECK(a.assignment().world_size() == 24);
  CHECK(a.assignment().master_addr() == "10.0.0.1");
  CHECK(a.assignment().master_port() == 29500);
  CHECK(a.assignment().restart_count() == 1);
  CHECK_FALSE(a.assignment().spare());
  CHECK(a.assignment().durable_service());
  CHECK(a.assignment().waited_for_nodes_ms() == 5100);
  REQUIRE(a.assignment().members_size() == 2);
  CHECK(a.assignment().members(0).host() == "node-a");
  CHECK(a.assignment().members(0).address() == "10.0.0.2");
  CHECK(a.assignment().members(0).nproc() == 2);
  CHECK(std::vector<std::uint32_t>(a.assignment().members(0).ports().begin(),
                                   a.assignment().members(0).ports().end()) ==
        std::vector<std::uint32_t>{4000, 4001});
  CHECK(a.assignment().members(1).address() == "fd00::3");
  CHECK(a.assignment().members(1).ports_size() == 0);

  // The two pieces (the head per node, the member list once) are one message on the wire,
  // the same as the whole.
  const std::string members = EncodeMembers(*assignment.members);
  const std::string split = EncodeAssignmentHead(assignment, members.size()) + members;
  v1::ServiceMessage parsed;
  REQUIRE(parsed.ParseFromString(split));
  CHECK(parsed.SerializeAsString() == ToProto(assignment).SerializeAsString());
  CHECK(parsed.assignment().members_size() == 2);
  CHECK(parsed.assignment().group_rank() == 1);

  const auto s =
      OverTheWire(ToProto(msg::StopAndRejoin{"node b was lost", true, "node lost", 4200}));
  REQUIRE(s.has_stop_and_rejoin());
  CHECK(s.stop_and_rejoin().reason() == "node b was lost");
  CHECK(s.stop_and_rejoin().spends_restart());
  CHECK(s.stop_and_rejoin().kind() == "node lost");
  CHECK(s.stop_and_rejoin().fault_ms_ago() == 4200);

  const auto r = OverTheWire(ToProto(msg::Refused{"protocol version 2"}));
  REQUIRE(r.has_refused());
  CHECK(r.refused().reason() == "protocol version 2");
}

TEST_CASE("a status response reaches `crun status` whole", "[proto]") {
  msg::StatusResponse status;
  auto& job = status.jobs.emplace_back();
  job.run_id = "job7";
  job.phase = "running";
  job.round = 4;
  job.restarts_used = 1;
  job.max_restarts = 3;
  job.last_failure = "rank 3 failed";
  job.min_nodes = 1;
  job.max_nodes = 4;
  job.world_size = 16;
  job.lost_hosts = {"c"};
  auto& member = job.nodes.emplace_back();
  member.node_id = "a";
  member.host = "node-a";
  member.state = "member";
  member.group_rank = 0;
  member.nproc = 8;
  member.last_heartbeat_ms_ago = 250;
  member.snapshots = {1 << 20, 77, -1};
  auto& spare = job.nodes.emplace_back();
  spare.node_id = "d";
  spare.host = "node-d";
  spare.state = "spare";
  spare.nproc = 8;
  job.unhealthy_reports = 2;
  auto& sick = job.nodes.emplace_back();
  sick.node_id = "c";
  sick.host = "node-c";
  sick.state = "unhealthy";
  sick.reason = "gpu: GPU 0 does not answer";

  const auto wire = OverTheWire(ToProto(status));
  REQUIRE(wire.jobs_size() == 1);
  const auto& j = wire.jobs(0);
  CHECK(j.run_id() == "job7");
  CHECK(j.phase() == "running");
  CHECK(j.round() == 4);
  CHECK(j.restarts_used() == 1);
  CHECK(j.max_restarts() == 3);
  CHECK(j.last_failure() == "rank 3 failed");
  CHECK(j.min_nodes() == 1);
  CHECK(j.max_nodes() == 4);
  CHECK(j.world_size() == 16);
  REQUIRE(j.lost_hosts_size() == 1);
  CHECK(j.lost_hosts(0) == "c");
  REQUIRE(j.nodes_size() == 3);
  CHECK(j.unhealthy_reports() == 2);
  CHECK(j.nodes(2).state() == "unhealthy");
  CHECK(j.nodes(2).reason() == "gpu: GPU 0 does not answer");
  CHECK(j.nodes(0).reason().empty());
  CHECK(j.nodes(0).node_id() == "a");
  CHECK(j.nodes(0).host() == "node-a");
  CHECK(j.nodes(0).state() == "member");
  CHECK(j.nodes(0).group_rank() == 0);
  CHECK(j.nodes(0).nproc() == 8);
  CHECK(j.nodes(0).last_heartbeat_ms_ago() == 250);
  CHECK(j.nodes(0).snapshot_bytes() == 1 << 20);
  CHECK(j.nodes(0).snapshot_step() == 77);
  CHECK_FALSE(j.nodes(0).has_disk_step());  // none written: unset, not 0
  CHECK(j.nodes(1).state() == "spare");
  CHECK_FALSE(j.nodes(1).has_snapshot_step());
  CHECK(j.nodes(1).group_rank() == -1);
}

TEST_CASE("a job's settings go to the wire and back whole, --contract included", "[proto]") {
  crun::rdzv::Settings s;
  s.min_nodes = 2;
  s.max_nodes = 4;
  s.max_restarts = 3;
  s.join_timeout = crun::rdzv::Millis(7'000);
  s.last_call_timeout = crun::rdzv::Millis(250);
  s.heartbeat_timeout = crun::rdzv::Millis(1'500);
  s.contracts = crun::ParseContracts("tensorflow,jax,horovod").value();
  const crun::rdzv::Settings back = FromProto(OverTheWire(ToProto(s)));
  CHECK(back.CheckCompatible(s).ok());
  CHECK(back.min_nodes == 2);
  CHECK(back.max_nodes == 4);
  CHECK(back.max_restarts == 3);
  CHECK(back.join_timeout == s.join_timeout);
  CHECK(back.last_call_timeout == s.last_call_timeout);
  CHECK(back.heartbeat_timeout == s.heartbeat_timeout);
  CHECK(back.contracts == s.contracts);
  // An agent that predates the field sends none: torch alone.
  v1::Settings old = ToProto(s);
  old.clear_contracts();
  CHECK(FromProto(old).contracts == crun::ContractSet());
}

TEST_CASE("settings read from the wire as protobuf wrote them, absent fields at default",
          "[proto][settings]") {
  v1::Settings m;  // as a crun that writes the generated message field by field sends it
  m.set_min_nodes(3);
  m.set_max_nodes(5);
  m.set_max_restarts(-1);  // a negative int32: ten bytes on the wire
  m.set_heartbeat_timeout_ms(2'500);
  m.set_max_restarts_without_progress(0);  // present: 0 (never), not the default
  const crun::rdzv::Settings s = FromProto(OverTheWire(m));
  const crun::rdzv::Settings defaults;
  CHECK(s.min_nodes == 3);
  CHECK(s.max_nodes == 5);
  CHECK(s.max_restarts == -1);
  CHECK(s.heartbeat_timeout == crun::rdzv::Millis(2'500));
  CHECK(s.max_restarts_without_progress == 0);
  CHECK(s.join_timeout == defaults.join_timeout);  // absent: the default
  CHECK(s.contracts == defaults.contracts);
  // And the other way, what the generated message reads back is what was set.
  const v1::Settings back = OverTheWire(ToProto(s));
  CHECK(back.min_nodes() == 3);
  CHECK(back.max_restarts() == -1);
  CHECK(back.heartbeat_timeout_ms() == 2'500);
  CHECK(back.has_max_restarts_without_progress());
  CHECK(back.max_restarts_without_progress() == 0);
  // A field from a newer crun (an unknown number, another wire type) is skipped.
  std::string newer = m.SerializeAsString();
  newer += std::string("\xb2\x03\x02hi", 5);  // field 54, length-delimited: "hi"
  newer += std::string("\xa8\x03\x07", 3);    // field 53, varint 7
  v1::Settings from_newer;
  REQUIRE(from_newer.ParseFromString(newer));
  CHECK(FromProto(from_newer) == s);
}

namespace {

// Every field of the one list (rules/settings.h) set apart from its default and from the others.
crun::rdzv::Settings EveryFieldSet() {
  crun::rdzv::Settings s;
  int i = 0;
  for (const auto& f : crun::rdzv::SettingFields()) {
    ++i;
    if (f.kind == crun::rdzv::SettingField::Kind::kContracts) {
      s.contracts = crun::ParseContracts("tf,horovod").value();
    } else {
      f.set(s, f.get(s) + 11 * i);
    }
  }
  return s;
}

}  // namespace

TEST_CASE("the settings' one list is crun.v1.Settings, field for field", "[proto][settings]") {
  std::ifstream in(CRUN_V1_DESCRIPTORS, std::ios::binary);
  google::protobuf::FileDescriptorSet files;
  REQUIRE(files.ParseFromIstream(&in));
  google::protobuf::DescriptorPool pool;
  for (const auto& file : files.file()) REQUIRE(pool.BuildFile(file) != nullptr);
  const auto* settings = pool.FindMessageTypeByName("crun.v1.Settings");
  REQUIRE(settings != nullptr);
  int on_wire = 0;
  for (const auto& f : crun::rdzv::SettingFields()) {
    INFO(f.name);
    if (f.proto_number == 0) continue;
    ++on_wire;
    CHECK(f.proto_number < 64);  // the conversion reads numbers below 64
    const auto* field = settings->FindFieldByNumber(f.proto_number);
    REQUIRE(field != nullptr);
    CHECK(field->name() == crun::rdzv::WireName(f));
  }
  CHECK(settings->field_count() == on_wire);  // no field of the proto outside the list
  // And the conversions carry every one of them, each its own value.
  const crun::rdzv::Settings s = EveryFieldSet();
  const crun::rdzv::Settings back = FromProto(OverTheWire(ToProto(s)));
  for (const auto& f : crun::rdzv::SettingFields()) {
    INFO(f.name);
    const crun::rdzv::Settings defaults;
    CHECK(f.get(back) == (f.proto_number != 0 ? f.get(s) : f.get(defaults)));
  }
}

TEST_CASE("each report of the table crosses the wire whole, and protobuf prints it as ToJson",
          "[proto]") {
  const JsonPrinter printer;
  for (const auto& c : crun::testing::ReportCases()) {
    INFO(c.name);
    const auto wire = OverTheWire(ToProto(c.report));
    CHECK(FromProto(wire) == c.report);
    // The stored JSON (rendezvous/report/report.h's ToJson) is protobuf's own mapping of the
    // message: what protobuf's printer writes for it, byte for byte.
    const std::string printed = printer.Print(wire);
    CHECK(printed == c.stored);
    CHECK(printed == crun::report::ToJson(c.report));
  }
}
