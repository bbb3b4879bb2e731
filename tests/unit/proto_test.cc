// The wire schema of crun.v1 as a contract: messages round-trip, and the service has the shape
// agents and `crun status` rely on (a bidirectional Session, a unary Status).
#include <catch2/catch.hpp>

#include "crun/v1/rendezvous.grpc.pb.h"

TEST_CASE("an agent's join round-trips through the wire format", "[proto]") {
  crun::v1::AgentMessage m;
  auto* join = m.mutable_join();
  join->set_protocol_version(1);
  join->set_run_id("job7");
  join->mutable_node()->set_node_id("node-a#123");
  join->mutable_node()->set_host("node-a");
  join->mutable_node()->add_addresses("10.0.0.5");
  join->mutable_node()->set_nproc(8);
  join->mutable_node()->set_requested_rank(3);
  join->mutable_settings()->set_min_nodes(2);
  join->mutable_settings()->set_max_nodes(4);
  std::string bytes;
  REQUIRE(m.SerializeToString(&bytes));
  crun::v1::AgentMessage back;
  REQUIRE(back.ParseFromString(bytes));
  REQUIRE(back.kind_case() == crun::v1::AgentMessage::kJoin);
  CHECK(back.join().run_id() == "job7");
  CHECK(back.join().node().requested_rank() == 3);
  CHECK(back.join().settings().max_nodes() == 4);
  CHECK_FALSE(
      crun::v1::NodeDescription().has_requested_rank());  // "none imposed" is distinct from 0
}

TEST_CASE("a failure report keeps exit code and signal apart", "[proto]") {
  crun::v1::WorkerFailure f;
  f.set_signal(9);
  CHECK(f.exit_case() == crun::v1::WorkerFailure::kSignal);
  f.set_exit_code(0);
  CHECK(f.exit_case() == crun::v1::WorkerFailure::kExitCode);  // exit code 0 is still recorded
}

TEST_CASE("the service: a bidirectional Session and a unary Status", "[proto]") {
  const auto* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("crun.v1.Rendezvous");
  REQUIRE(service != nullptr);
  CHECK(service->full_name() == "crun.v1.Rendezvous");
  const auto* session = service->FindMethodByName("Session");
  REQUIRE(session != nullptr);
  CHECK(session->client_streaming());
  CHECK(session->server_streaming());
  const auto* status = service->FindMethodByName("Status");
  REQUIRE(status != nullptr);
  CHECK_FALSE(status->client_streaming());
  CHECK_FALSE(status->server_streaming());
}
