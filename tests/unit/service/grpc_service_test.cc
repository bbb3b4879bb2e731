// The rendezvous service over real gRPC on loopback: sessions, pushed messages, the round's
// worker store, Status, the health service, a second daemon on a taken port. Waits are on
// messages arriving (condition variables), never on time.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "agent/rendezvous/beat_sender.h"
#include "agent/rendezvous/session_client.h"
#include "base/security.h"
#include "base/socket.h"
#include "crun/v1/health.grpc.pb.h"
#include "proto/protocol_version.h"
#include "rendezvous/service/grpc_service.h"
#include "rendezvous/store/tcp_store_client.h"
#include "tests/unit/metrics_page.h"
#include <grpcpp/generic/generic_stub.h>

namespace {

using crun::agent::SessionClient;
using crun::rdzv::RendezvousService;
using crun::rdzv::ServiceOptions;
namespace v1 = crun::v1;

// Every wait on the service has a deadline: a service that never answers fails the test.
constexpr std::chrono::seconds kDeadline{30};

// Every call of these tests: a deadline, and waiting for its connection. A channel gives up on a
// handshake after 100 ms (rdzv::ChannelOptions::min_connect), which a loaded machine can take;
// a call that fails at once would then read UNAVAILABLE where the test asks something else.
void Patient(grpc::ClientContext& ctx) {
  ctx.set_deadline(std::chrono::system_clock::now() + kDeadline);
  ctx.set_wait_for_ready(true);
}

std::unique_ptr<RendezvousService> StartService(const std::string& token = "",
                                                bool metrics = false) {
  ServiceOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.log_decisions = false;
  o.security.token = token;
  if (metrics) o.metrics = crun::http::HttpServerOptions{};  // loopback, a free port
  auto s = RendezvousService::Start(o);
  REQUIRE(s.ok());
  return std::move(s).value();
}

// One agent's session, with its messages collected for the test to wait on.
class Agent {
 public:
  // wait_for_ready: the session waits for a service it cannot reach yet (as crun's agent does);
  // else it fails at once.
  Agent(std::uint16_t port, std::string node, const std::string& token = "",
        bool wait_for_ready = true)
      : node_(std::move(node)),
        channel_(crun::agent::MakeChannel("127.0.0.1:" + std::to_string(port), {})),
        stub_(v1::Rendezvous::NewStub(channel_)) {
    client_ = std::make_unique<SessionClient>(
        *stub_,
        [this](v1::ServiceMessage m) {
          std::lock_guard lock(mu_);
          inbox_.push_back(std::move(m));
          cv_.notify_all();
        },
        [this](const crun::Status& s) {
          std::lock_guard lock(mu_);
          done_ = true;
          done_status_ = s;
          cv_.notify_all();
        },
        crun::agent::CallOptions{token, wait_for_ready});
  }

  void Join(int min = 2, int max = 2, int max_restarts = 1, const std::string& run = "job7",
            int heartbeat_timeout_ms = 0) {
    v1::AgentMessage m;
    auto* j = m.mutable_join();
    j->set_protocol_version(1);
    j->set_run_id(run);
    j->set_service_host("127.0.0.1");
    j->mutable_node()->set_node_id(node_);
    j->mutable_node()->set_host(node_);
    j->mutable_node()->set_nproc(2);
    j->mutable_settings()->set_min_nodes(min);
    j->mutable_settings()->set_max_nodes(max);
    j->mutable_settings()->set_max_restarts(max_restarts);
    j->mutable_settings()->set_last_call_timeout_ms(100);
    if (heartbeat_timeout_ms > 0)
      j->mutable_settings()->set_heartbeat_timeout_ms(heartbeat_timeout_ms);
    client_->Send(m);
  }
  // The service's heartbeat ticket and the address the stream reached (once a message came).
  std::optional<crun::rdzv::BeatTicket> ticket() const { return client_->beat_ticket(); }
  std::string peer() const { return client_->peer(); }
  void Fail(int rank, int code) {
    v1::AgentMessage m;
    m.mutable_workers_failed()->set_host(node_);
    auto* f = m.mutable_workers_failed()->add_failures();
    f->set_rank(rank);
    f->set_exit_code(code);
    client_->Send(m);
  }
  void Send(const v1::AgentMessage& m) { client_->Send(m); }
  void Succeed() {
    v1::AgentMessage m;
    m.mutable_workers_succeeded();
    client_->Send(m);
  }
  // The next message the service pushed (in order).
  v1::ServiceMessage Next() {
    std::unique_lock lock(mu_);
    REQUIRE(cv_.wait_for(lock, kDeadline, [this] { return !inbox_.empty() || done_; }));
    REQUIRE_FALSE(inbox_.empty());
    auto m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }
  bool HasMessage() {
    std::lock_guard lock(mu_);
    return !inbox_.empty();
  }
  bool Ended() {
    std::lock_guard lock(mu_);
    return done_;
  }
  // The next message, or nothing once one of `all` (this one among them) ended: a round that
  // needs every agent never forms when one's session failed. Bounded by kDeadline.
  std::optional<v1::ServiceMessage> NextUnlessOneEnded(
      const std::vector<std::unique_ptr<Agent>>& all) {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::unique_lock lock(mu_);
        if (cv_.wait_for(lock, std::chrono::milliseconds(10), [this] { return !inbox_.empty(); })) {
          auto m = std::move(inbox_.front());
          inbox_.pop_front();
          return m;
        }
      }
      for (const auto& a : all) {
        if (a->Ended()) return std::nullopt;
      }
    }
    FAIL("no message and no agent ended within " << kDeadline.count() << " s");
    return std::nullopt;
  }
  crun::Status WaitDone() {
    std::unique_lock lock(mu_);
    REQUIRE(cv_.wait_for(lock, kDeadline, [this] { return done_; }));
    return done_status_;
  }
  void Drop() { client_->Cancel(); }
  void Close() { client_->Close(); }
  v1::Rendezvous::Stub& stub() { return *stub_; }

 private:
  std::string node_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::ServiceMessage> inbox_;
  bool done_ = false;
  crun::Status done_status_ = crun::Status::Ok();
  std::unique_ptr<SessionClient> client_;  // last: destroyed (and closed) first
};

// A UDP socket connected to 127.0.0.1:port.
int UdpTo(std::uint16_t port) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(port);
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0);
  return fd;
}

// The body of GET `url` ("http://127.0.0.1:PORT/metrics"), over a plain socket.
std::string Scrape(const std::string& url) {
  const auto colon = url.rfind(':');
  const auto port = std::stoi(url.substr(colon + 1, url.find('/', colon) - colon - 1));
  auto fd = crun::ConnectTcp("127.0.0.1", static_cast<std::uint16_t>(port),
                             crun::DeadlineAfter(kDeadline));
  REQUIRE(fd.ok());
  const auto deadline = crun::DeadlineAfter(kDeadline);
  REQUIRE(crun::SendAll(fd->get(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                        deadline, "metrics")
              .ok());
  std::string got;
  char buf[4096];
  while (true) {
    auto n = crun::RecvSome(fd->get(), buf, 1, sizeof buf, deadline, "metrics");
    if (!n.ok()) break;  // closed (a timeout fails below: no 200)
    got.append(buf, *n);
  }
  REQUIRE(got.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  return got.substr(got.find("\r\n\r\n") + 4);
}

}  // namespace

TEST_CASE("grpc service: a round forms and its worker store is reachable", "[grpc]") {
  auto service = StartService();
  Agent a(service->port(), "node-a"), b(service->port(), "node-b");
  a.Join();
  b.Join();
  auto ra = a.Next().assignment();
  auto rb = b.Next().assignment();
  CHECK(ra.group_rank() == 0);
  CHECK(rb.group_rank() == 1);
  CHECK(rb.base_rank() == 2);
  CHECK(ra.world_size() == 4);
  CHECK(ra.master_addr() == "127.0.0.1");
  REQUIRE(ra.master_port() == rb.master_port());

  crun::TcpStoreClientOptions so;
  so.host = ra.master_addr();
  so.port = static_cast<std::uint16_t>(ra.master_port());
  auto store = crun::TcpStoreClient::Connect(so);
  REQUIRE(store.ok());
  REQUIRE((*store)->Set("k", "v").ok());
  CHECK((*store)->Get("k").value() == "v");

  v1::StatusRequest req;
  v1::StatusResponse resp;
  grpc::ClientContext ctx;
  Patient(ctx);
  REQUIRE(a.stub().Status(&ctx, req, &resp).ok());
  REQUIRE(resp.jobs_size() == 1);
  CHECK(resp.jobs(0).phase() == "running");
  CHECK(resp.jobs(0).nodes_size() == 2);
  CHECK(service->stats().sessions == 2);
}

TEST_CASE("grpc service: a failure is pushed to every node, a dropped agent is lost", "[grpc]") {
  auto service = StartService();
  Agent a(service->port(), "node-a"), b(service->port(), "node-b"), c(service->port(), "node-c");
  a.Join(2, 3);
  b.Join(2, 3);
  c.Join(2, 3);
  for (auto* x : {&a, &b, &c}) REQUIRE(x->Next().has_assignment());
  b.Fail(3, 7);
  for (auto* x : {&a, &b, &c}) {
    auto m = x->Next();
    REQUIRE(m.has_stop_and_rejoin());
    CHECK(m.stop_and_rejoin().spends_restart());
  }
  a.Join(2, 3);
  b.Join(2, 3);
  c.Join(2, 3);
  for (auto* x : {&a, &b, &c}) CHECK(x->Next().assignment().restart_count() == 1);

  c.Drop();  // the agent process died: its stream breaks
  for (auto* x : {&a, &b}) {
    auto m = x->Next();
    REQUIRE(m.has_stop_and_rejoin());
    CHECK(m.stop_and_rejoin().reason() == "node node-c (node-c) was lost: its session ended");
  }
  a.Join(2, 3);
  b.Join(2, 3);
  auto ra = a.Next().assignment();  // after the 100 ms last call
  CHECK(ra.group_world_size() == 2);
  CHECK(ra.restart_count() == 1);  // a loss spends nothing
  CHECK(b.Next().assignment().group_world_size() == 2);

  a.Succeed();
  b.Succeed();
  CHECK(a.Next().finished().success());
  CHECK(b.Next().finished().success());
}

TEST_CASE("grpc service: budget exhausted -> the same report on every node", "[grpc]") {
  auto service = StartService();
  Agent a(service->port(), "node-a"), b(service->port(), "node-b");
  a.Join(2, 2, 0);
  b.Join(2, 2, 0);
  REQUIRE(a.Next().has_assignment());
  REQUIRE(b.Next().has_assignment());
  a.Fail(1, 42);
  auto fa = a.Next().finished();
  auto fb = b.Next().finished();
  CHECK_FALSE(fa.success());
  CHECK(fa.exit_code() == 42);
  CHECK(fb.exit_code() == 42);
  CHECK(fa.root_cause().SerializeAsString() == fb.root_cause().SerializeAsString());
  CHECK(fb.root_cause().host() == "node-a");
}

TEST_CASE("grpc service: conflicting settings are refused, naming them", "[grpc]") {
  auto service = StartService();
  Agent a(service->port(), "node-a"), b(service->port(), "node-b");
  a.Join(1, 1);
  REQUIRE(a.Next().has_assignment());  // the job exists with a's settings before b joins
  b.Join(1, 2);
  CHECK(b.Next().refused().reason() ==
        "--nnodes differs: this job uses 1:1, the joining agent 1:2");
}

TEST_CASE("grpc service: the standard health service answers anyone, Check and Watch", "[grpc]") {
  namespace health = grpc::health::v1;
  // A job token does not keep a probe out: Kubernetes' gRPC probes carry none.
  auto service = StartService(GENERATE(std::string(), std::string("s3cret-token")));
  auto channel = crun::agent::MakeChannel("127.0.0.1:" + std::to_string(service->port()), {});
  auto stub = health::Health::NewStub(channel);
  for (const std::string name : {"", "crun.v1.Rendezvous"}) {
    grpc::ClientContext ctx;
    Patient(ctx);
    health::HealthCheckRequest request;
    request.set_service(name);
    health::HealthCheckResponse response;
    const grpc::Status s = stub->Check(&ctx, request, &response);
    INFO(s.error_code() << ": " << s.error_message());
    REQUIRE(s.ok());
    CHECK(response.status() == health::HealthCheckResponse::SERVING);
  }
  {
    grpc::ClientContext ctx;
    Patient(ctx);
    health::HealthCheckRequest request;
    request.set_service("no.such.Service");
    health::HealthCheckResponse response;
    const grpc::Status s = stub->Check(&ctx, request, &response);
    CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK_THAT(s.error_message(), Catch::Contains("no.such.Service"));
  }
  for (const auto& [name, want] :
       {std::pair{std::string("crun.v1.Rendezvous"), health::HealthCheckResponse::SERVING},
        std::pair{std::string("no.such.Service"), health::HealthCheckResponse::SERVICE_UNKNOWN}}) {
    grpc::ClientContext ctx;
    Patient(ctx);
    health::HealthCheckRequest request;
    request.set_service(name);
    auto reader = stub->Watch(&ctx, request);
    health::HealthCheckResponse response;
    REQUIRE(reader->Read(&response));
    CHECK(response.status() == want);
    ctx.TryCancel();
    while (reader->Read(&response)) {
    }
  }
  // A watch still open when the service stops is ended, within the grace.
  grpc::ClientContext ctx;
  Patient(ctx);
  auto reader = stub->Watch(&ctx, health::HealthCheckRequest());
  health::HealthCheckResponse response;
  REQUIRE(reader->Read(&response));
  service->Stop(std::chrono::milliseconds(100));
  CHECK_FALSE(reader->Read(&response));
  CHECK(reader->Finish().error_code() != grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_CASE("grpc service: a taken port is an error naming it", "[grpc]") {
  auto first = StartService();
  ServiceOptions o;
  o.host = "127.0.0.1";
  o.port = first->port();
  o.log_decisions = false;
  auto second = RendezvousService::Start(o);
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(second.status().message(),
             Catch::Contains("cannot listen on 127.0.0.1:" + std::to_string(first->port())));
  CHECK_THAT(second.status().message(), Catch::Contains("in use"));
  // As the store server says it: a caller may join whoever serves the port.
  CHECK(second.status().code() == crun::StatusCode::kUnavailable);
}

TEST_CASE("grpc service: stopping the service ends every agent's session", "[grpc]") {
  auto service = StartService();
  Agent a(service->port(), "node-a");
  a.Join(1, 1);
  REQUIRE(a.Next().has_assignment());
  service->Stop();
  CHECK_FALSE(a.WaitDone().ok());
}

// Stopping races every operation a session has in flight: its read, a write of the round's
// assignment, an agent that drops or closes its side at the same moment. Each stop must end
// every session and return (a queue shut down under a live call aborts the process).
TEST_CASE("grpc service: stopped while its sessions are busy, 100 times over", "[grpc]") {
  std::mt19937 rng(20261129);
  for (int i = 0; i < 100; ++i) {
    auto service = StartService();
    std::vector<std::unique_ptr<Agent>> agents;
    const int n = 2 + static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) {
      // Not waiting for the service: a session that had not reached it before the stop fails.
      agents.push_back(
          std::make_unique<Agent>(service->port(), "node-" + std::to_string(k), "", false));
      agents.back()->Join(n, n);
    }
    switch (rng() % 4) {
      case 0:  // stop at once: joins still on their way
        break;
      // Agents that do not wait for the service may fail before it answers (a slow build,
      // ThreadSanitizer's): the round then never forms, and the stop races the rest.
      case 1:  // stop as the assignments are written
        agents[0]->NextUnlessOneEnded(agents);
        break;
      case 2:  // one agent drops while the others hear of the round
        agents[rng() % agents.size()]->Drop();
        break;
      default:  // one closes its side, one fails its workers
        agents[0]->NextUnlessOneEnded(agents);
        agents[1]->Close();
        agents[0]->Fail(0, 3);
        break;
    }
    service->Stop(std::chrono::milliseconds(rng() % 3 * 10));
    for (auto& a : agents) static_cast<void>(a->WaitDone());  // ended, however it ended
  }
}

TEST_CASE(
    "grpc service: with a job token, sessions without it or with another are refused "
    "and the job goes on",
    "[grpc][security]") {
  auto service = StartService("s3cret-token");
  Agent a(service->port(), "node-a", "s3cret-token"), b(service->port(), "node-b", "s3cret-token");
  Agent none(service->port(), "node-x"), wrong(service->port(), "node-y", "guess");
  none.Join();
  wrong.Join();
  auto refused = none.WaitDone();
  CHECK(refused.code() == crun::StatusCode::kPermissionDenied);
  CHECK_THAT(refused.message(), Catch::Contains("requires a job token"));
  auto mismatch = wrong.WaitDone();
  CHECK(mismatch.code() == crun::StatusCode::kPermissionDenied);
  CHECK_THAT(mismatch.message(), Catch::Contains("does not match"));
  a.Join();
  b.Join();
  CHECK(a.Next().assignment().world_size() == 4);
  CHECK(b.Next().assignment().world_size() == 4);
  CHECK(service->stats().refused_calls == 2);
  CHECK(service->stats().sessions == 2);
}

TEST_CASE("grpc service: Status needs the job token too", "[grpc][security]") {
  auto service = StartService("s3cret-token");
  auto channel = crun::agent::MakeChannel("127.0.0.1:" + std::to_string(service->port()), {});
  auto stub = v1::Rendezvous::NewStub(channel);
  v1::StatusRequest req;
  v1::StatusResponse resp;
  {
    grpc::ClientContext ctx;
    Patient(ctx);
    CHECK(stub->Status(&ctx, req, &resp).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  grpc::ClientContext ctx;
  Patient(ctx);
  ctx.AddMetadata(crun::kTokenHeader, "s3cret-token");
  CHECK(stub->Status(&ctx, req, &resp).ok());
}

TEST_CASE("grpc service: the Stacks call gathers every node's answer, needs the token",
          "[grpc][stacks]") {
  auto service = StartService("s3cret-token");
  Agent a(service->port(), "node-a", "s3cret-token"), b(service->port(), "node-b", "s3cret-token");
  a.Join();
  b.Join();
  REQUIRE(a.Next().has_assignment());
  REQUIRE(b.Next().has_assignment());
  auto channel = crun::agent::MakeChannel("127.0.0.1:" + std::to_string(service->port()), {});
  auto stub = v1::Rendezvous::NewStub(channel);
  v1::StacksQuery query;
  query.set_run_id("job7");
  query.set_timeout_ms(20'000);
  {
    grpc::ClientContext ctx;
    Patient(ctx);
    v1::StacksResult ignored;
    CHECK(stub->Stacks(&ctx, query, &ignored).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  // The call waits for both nodes; each answers the request it is sent.
  v1::StacksResult result;
  grpc::Status status;
  std::thread call([&] {
    grpc::ClientContext ctx;
    Patient(ctx);
    ctx.AddMetadata(crun::kTokenHeader, "s3cret-token");
    status = stub->Stacks(&ctx, query, &result);
  });
  for (auto* agent : {&a, &b}) {
    const auto request = agent->Next();
    REQUIRE(request.has_stacks_request());
    CHECK(request.stacks_request().reason() == crun::kStacksCommandReason);
    const std::string node = agent == &a ? "node-a" : "node-b";
    v1::AgentMessage reply;
    reply.mutable_stacks_reply()->set_request_id(request.stacks_request().request_id());
    auto* n = reply.mutable_stacks_reply()->mutable_node();
    n->set_node_id(node);
    auto* r = n->add_ranks();
    r->set_rank(agent == &a ? 0 : 2);
    r->set_tool("py-spy");
    r->add_threads()->add_frames()->set_function("train_step");
    agent->Send(reply);
  }
  call.join();
  REQUIRE(status.ok());
  CHECK(result.run_id() == "job7");
  REQUIRE(result.nodes_size() == 2);
  std::set<std::string> nodes{result.nodes(0).node_id(), result.nodes(1).node_id()};
  CHECK(nodes == std::set<std::string>{"node-a", "node-b"});
  CHECK(result.nodes(0).ranks(0).threads(0).frames(0).function() == "train_step");
  CHECK(result.missing_size() == 0);
  {
    grpc::ClientContext ctx;
    Patient(ctx);
    ctx.AddMetadata(crun::kTokenHeader, "s3cret-token");
    query.set_run_id("nope");
    CHECK(stub->Stacks(&ctx, query, &result).error_code() == grpc::StatusCode::NOT_FOUND);
  }
}

TEST_CASE("grpc service: stopping the service ends a Stacks call still waiting for nodes",
          "[grpc][stacks]") {
  auto service = StartService();
  Agent a(service->port(), "node-a");
  a.Join(1, 1);
  REQUIRE(a.Next().has_assignment());
  auto stub = v1::Rendezvous::NewStub(
      crun::agent::MakeChannel("127.0.0.1:" + std::to_string(service->port()), {}));
  grpc::Status status;
  std::thread call([&] {
    grpc::ClientContext ctx;
    Patient(ctx);
    v1::StacksQuery query;
    query.set_run_id("job7");
    query.set_timeout_ms(60'000);
    v1::StacksResult result;
    status = stub->Stacks(&ctx, query, &result);
  });
  REQUIRE(a.Next().has_stacks_request());  // node-a never answers
  service->Stop();
  call.join();
  // Ended by the stop (not by the call's own deadline, which would be DEADLINE_EXCEEDED).
  CHECK(status.error_code() == grpc::StatusCode::UNAVAILABLE);
}

TEST_CASE("grpc service: /metrics counts sessions, refusals by reason and the job's rounds",
          "[grpc][metrics]") {
  using crun::testing::SampleValue;
  auto service = StartService("s3cret-token", true);
  const std::string url = service->metrics_url();
  CHECK_THAT(url, Catch::StartsWith("http://127.0.0.1:"));
  Agent a(service->port(), "node-a", "s3cret-token"), b(service->port(), "node-b", "s3cret-token");
  Agent none(service->port(), "node-x"), wrong(service->port(), "node-y", "guess");
  none.Join();
  wrong.Join();
  CHECK(none.WaitDone().code() == crun::StatusCode::kPermissionDenied);
  CHECK(wrong.WaitDone().code() == crun::StatusCode::kPermissionDenied);
  a.Join();
  b.Join();
  REQUIRE(a.Next().has_assignment());
  REQUIRE(b.Next().has_assignment());
  a.Fail(1, 3);  // one restart: both re-join
  REQUIRE(a.Next().has_stop_and_rejoin());
  REQUIRE(b.Next().has_stop_and_rejoin());
  a.Join();
  b.Join();
  REQUIRE(a.Next().has_assignment());
  REQUIRE(b.Next().has_assignment());
  const std::string page = Scrape(url);
  CHECK(SampleValue(page, "crun_rendezvous_refused_total{reason=\"token_missing\"}") == 1);
  CHECK(SampleValue(page, "crun_rendezvous_refused_total{reason=\"token_wrong\"}") == 1);
  CHECK(SampleValue(page, "crun_rendezvous_grpc_sessions_total") == 4);
  CHECK(SampleValue(page, "crun_rendezvous_grpc_sessions") == 2);
  CHECK(SampleValue(page, "crun_rendezvous_agents_connected") == 2);
  CHECK(SampleValue(page, "crun_rendezvous_jobs{phase=\"running\"}") == 1);
  CHECK(SampleValue(page, "crun_rendezvous_rounds_total{run_id=\"job7\"}") == 2);
  CHECK(SampleValue(page, "crun_rendezvous_restarts_total{run_id=\"job7\"}") == 1);
  CHECK(SampleValue(page, "crun_rendezvous_failures_total{run_id=\"job7\",cause=\"exit_code\"}") ==
        1);
  CHECK(SampleValue(page, "crun_rendezvous_round_formation_seconds_count") == 2);
}

// A Session stream whose bytes are no AgentMessage (a stranger's client, a broken agent) is
// ended with a status that says so, counted, and its node is lost to the job: a round forms
// without it. Before, the bytes were dropped and the stream lived on.
TEST_CASE("grpc service: a Session message that does not parse ends the session",
          "[grpc][security]") {
  using crun::testing::SampleValue;
  auto service = StartService("", true);
  auto channel = crun::agent::MakeChannel("127.0.0.1:" + std::to_string(service->port()), {});
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  Patient(ctx);
  auto call = stub.PrepareCall(&ctx, "/crun.v1.Rendezvous/Session", &cq);
  REQUIRE(call != nullptr);
  // Each operation in turn: its tag back from the queue, within the deadline.
  const auto await = [&cq](void* want) {
    void* tag = nullptr;
    bool ok = false;
    REQUIRE(cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + kDeadline) ==
            grpc::CompletionQueue::NextStatus::GOT_EVENT);
    CHECK(tag == want);
    return ok;
  };
  int tags[5];
  call->StartCall(&tags[0]);
  REQUIRE(await(&tags[0]));
  // A valid join first: the node is in the job's gathering (min 2), then garbage.
  v1::AgentMessage join;
  auto* j = join.mutable_join();
  j->set_protocol_version(1);
  j->set_run_id("job7");
  j->set_service_host("127.0.0.1");
  j->mutable_node()->set_node_id("node-raw");
  j->mutable_node()->set_host("node-raw");
  j->mutable_node()->set_nproc(2);
  j->mutable_settings()->set_min_nodes(2);
  j->mutable_settings()->set_max_nodes(2);
  j->mutable_settings()->set_max_restarts(1);
  j->mutable_settings()->set_last_call_timeout_ms(100);
  grpc::ByteBuffer bytes;
  bool own = false;
  REQUIRE(grpc::SerializationTraits<v1::AgentMessage>::Serialize(join, &bytes, &own).ok());
  call->Write(bytes, &tags[1]);
  REQUIRE(await(&tags[1]));
  // A truncated varint: no protobuf parser takes it.
  grpc::Slice garbage(std::string("\x0a\xff\xff\xff"));
  grpc::ByteBuffer bad(&garbage, 1);
  call->Write(bad, &tags[2]);
  REQUIRE(await(&tags[2]));
  grpc::ByteBuffer in;
  call->Read(&in, &tags[3]);
  CHECK_FALSE(await(&tags[3]));  // the service ended the stream
  grpc::Status status;
  call->Finish(&status, &tags[4]);
  REQUIRE(await(&tags[4]));
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(status.error_message(), Catch::Contains("does not parse as crun.v1.AgentMessage"));
  // Its node is gone from the gathering: two others form the round of two.
  Agent b(service->port(), "node-b"), c(service->port(), "node-c");
  b.Join();
  c.Join();
  for (Agent* agent : {&b, &c}) {
    const auto m = agent->Next();
    REQUIRE(m.has_assignment());
    for (const auto& member : m.assignment().members()) CHECK(member.host() != "node-raw");
  }
  const std::string page = Scrape(service->metrics_url());
  CHECK(SampleValue(page, "crun_rendezvous_refused_total{reason=\"malformed\"}") == 1);
  CHECK(SampleValue(page, "crun_rendezvous_grpc_sessions") == 2);
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

// Heartbeats as datagrams (rendezvous/beats): they alone keep a node in the job past its
// heartbeat_timeout, each is acked under its session's key, and what is not its session's key's
// (forged, replayed, unknown, garbage) is counted and keeps nobody alive: a node that stops
// beating is lost within heartbeat_timeout, as on the stream.
TEST_CASE("grpc service: heartbeat datagrams keep a node in the job, others are refused",
          "[grpc][beats]") {
  using crun::testing::SampleValue;
  auto service = StartService("", true);
  Agent a(service->port(), "node-a"), b(service->port(), "node-b");
  constexpr int kTimeoutMs = 600;
  a.Join(2, 2, 1, "job7", kTimeoutMs);
  b.Join(2, 2, 1, "job7", kTimeoutMs);
  REQUIRE(a.Next().has_assignment());
  REQUIRE(b.Next().has_assignment());
  const auto ta = a.ticket(), tb = b.ticket();
  REQUIRE(ta);
  REQUIRE(tb);
  CHECK(ta->session != tb->session);
  CHECK(ta->key != tb->key);
  auto socket = crun::agent::BeatSocket::Connect(a.peer(), ta->port);
  REQUIRE(socket.ok());
  std::uint64_t seq = 0;
  crun::v1::Heartbeat beat;
  const auto beat_both = [&] {
    beat.set_sequence(++seq);
    REQUIRE(socket->Send(*ta, beat).ok());
    REQUIRE(socket->Send(*tb, beat).ok());
  };
  beat_both();
  // Both acked, each under its own key, to the socket the beats came from.
  std::set<std::uint64_t> acked;
  const auto ack_by = std::chrono::steady_clock::now() + kDeadline;
  while (acked.size() < 2 && std::chrono::steady_clock::now() < ack_by) {
    socket->Receive(
        [&](std::string_view d) {
          for (const auto* t : {&*ta, &*tb}) {
            const auto ack = crun::rdzv::OpenAck(t->key, d);
            if (ack && ack->session == t->session && ack->sequence == seq) acked.insert(t->session);
          }
        },
        std::chrono::milliseconds(100));
  }
  REQUIRE(acked == std::set<std::uint64_t>{ta->session, tb->session});
  // Three timeouts long, beats every 100 ms and none on the streams: both stay in the round.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(3 * kTimeoutMs);
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // pacing the beats
    beat_both();
  }
  // What keeps nobody alive: another key's tag, a replay, an unknown session, garbage.
  const auto old = crun::rdzv::SealBeat(*ta, beat.SerializeAsString());  // seq already taken
  crun::rdzv::BeatTicket wrong = *ta;
  wrong.key = crun::rdzv::NewBeatKey();
  crun::rdzv::BeatTicket unknown = *ta;
  unknown.session = 999'999;
  crun::v1::Heartbeat later;
  later.set_sequence(seq + 1000);
  REQUIRE(socket->Send(wrong, later).ok());
  REQUIRE(socket->Send(unknown, later).ok());
  // Through a plain socket: a replay (a taken datagram's bytes again) and garbage.
  const int fd = UdpTo(ta->port);
  REQUIRE(send(fd, old.data(), old.size(), 0) == static_cast<ssize_t>(old.size()));
  REQUIRE(send(fd, "garbage", 7, 0) == 7);
  close(fd);
  // b goes on beating; a stops: b is told a was lost.
  const auto stop_by = std::chrono::steady_clock::now() + kDeadline;
  bool told = false;
  while (!told && std::chrono::steady_clock::now() < stop_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // pacing the beats
    beat.set_sequence(++seq);
    REQUIRE(socket->Send(*tb, beat).ok());
    told = b.HasMessage();
  }
  REQUIRE(told);
  const auto m = b.Next();
  REQUIRE(m.has_stop_and_rejoin());
  CHECK_THAT(m.stop_and_rejoin().reason(), Catch::Contains("node-a"));
  CHECK_THAT(m.stop_and_rejoin().reason(), Catch::Contains("no heartbeat"));
  const std::string page = Scrape(service->metrics_url());
  const auto count = [&page](const char* result) {
    return SampleValue(page, std::string("crun_rendezvous_beat_datagrams_total{result=\"") +
                                 result + "\"}");
  };
  CHECK(count("taken") >= 2 * 15);
  CHECK(count("forged") == 1);
  CHECK(count("stale") == 1);
  CHECK(count("unknown_session") == 1);
  CHECK(count("malformed") == 1);
  CHECK(SampleValue(page, "crun_rendezvous_beat_acks_unsent_total") == 0);
  CHECK(SampleValue(page, "crun_rendezvous_beat_datagrams_dropped_total") == 0);
}

TEST_CASE("grpc service: without UDP heartbeats a session gets no ticket", "[grpc][beats]") {
  ServiceOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.log_decisions = false;
  o.udp_heartbeats = false;
  auto service = RendezvousService::Start(o);
  REQUIRE(service.ok());
  Agent a((*service)->port(), "node-a");
  a.Join(1, 1);
  REQUIRE(a.Next().has_assignment());
  CHECK_FALSE(a.ticket());
}
