// The wire schema of crun.v1 as a contract: messages round-trip, and the service has the shape
// agents and `crun status` rely on (a bidirectional Session, a unary Status).
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <type_traits>

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

// A full (non-lite) message: it has a descriptor, registered at start.
template <typename T>
concept HasDescriptor = requires(const T& m) {
  m.GetDescriptor();
};

TEST_CASE("the service: a bidirectional Session and a unary Status", "[proto]") {
  // The messages are lite (no descriptors at run time): the shape is checked on the generated
  // stub's types, at compile time.
  using Stub = crun::v1::Rendezvous::Stub;
  CHECK(std::string(crun::v1::Rendezvous::service_full_name()) == "crun.v1.Rendezvous");
  static_assert(std::is_same_v<decltype(std::declval<Stub&>().Session(nullptr)),
                               std::unique_ptr<grpc::ClientReaderWriter<crun::v1::AgentMessage,
                                                                        crun::v1::ServiceMessage>>>,
                "Session is bidirectional: agent messages up, service messages down");
  static_assert(std::is_same_v<decltype(std::declval<Stub&>().Status(
                                   nullptr, std::declval<crun::v1::StatusRequest>(), nullptr)),
                               grpc::Status>,
                "Status is unary");
  static_assert(std::is_base_of_v<google::protobuf::MessageLite, crun::v1::AgentMessage> &&
                    !HasDescriptor<crun::v1::AgentMessage>,
                "crun's messages are lite: nothing registered at every start of crun");
}
