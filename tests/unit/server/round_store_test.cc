// RoundStoreHost and RoundStoreOptions (rendezvous/store_server/round_store.h): whom a round's
// store admits, and that a store is kept within its round and replaced, empty, for the next,
// both on a thread of its own (etcd's agent) and on the caller's loop (the static rendezvous).
#include <catch2/catch.hpp>

#include <thread>

#include <boost/asio/post.hpp>

#include "rendezvous/store/tcp_store_client.h"
#include "rendezvous/store_server/round_store.h"

namespace {

using crun::RoundStoreHost;
using crun::RoundStoreSpec;

crun::StatusOr<std::unique_ptr<crun::TcpStoreClient>> Connect(std::uint16_t port) {
  crun::TcpStoreClientOptions o;
  o.port = port;
  o.connect_timeout = std::chrono::seconds(5);
  o.timeout = std::chrono::seconds(5);
  return crun::TcpStoreClient::Connect(o);
}

RoundStoreSpec Loopback() {
  RoundStoreSpec spec;
  spec.bind_host = "127.0.0.1";
  spec.world_size = 2;
  return spec;
}

}  // namespace

TEST_CASE("round store: whom it admits and how many connections it expects", "[round_store]") {
  RoundStoreSpec spec;
  spec.world_size = 0;
  CHECK(crun::RoundStoreOptions(spec).expected_connections == 1);
  CHECK(crun::RoundStoreOptions(spec).allowed_peers.empty());  // members unknown: no list
  spec.world_size = 16;
  spec.members = {{"10.0.0.2"}, {"10.0.0.3", "192.168.7.3"}};
  const auto on_node = crun::RoundStoreOptions(spec);
  CHECK(on_node.expected_connections == 16);
  CHECK(on_node.allowed_peers ==
        std::vector<std::string>{"10.0.0.2", "10.0.0.3", "192.168.7.3", "127.0.0.1", "::1"});
  spec.host_runs_workers = false;  // the service's host: the members' own addresses only
  CHECK(crun::RoundStoreOptions(spec).allowed_peers ==
        std::vector<std::string>{"10.0.0.2", "10.0.0.3", "192.168.7.3"});
  spec.members.push_back({});  // one member of unknown address: no list rather than a wrong one
  CHECK(crun::RoundStoreOptions(spec).allowed_peers.empty());
}

TEST_CASE("round store: kept within a round, fresh for the next (own thread)", "[round_store]") {
  RoundStoreHost host;
  CHECK_FALSE(host.serving());
  CHECK(host.port() == 0);
  auto first = host.Serve(3, Loopback());
  REQUIRE(first.ok());
  CHECK(host.round() == 3);
  {
    auto c = Connect(*first);
    REQUIRE(c.ok());
    REQUIRE((*c)->Set("key", "round 3").ok());
  }
  // The same round again (another event of it): the same store, its keys kept.
  auto again = host.Serve(3, Loopback());
  REQUIRE(again.ok());
  CHECK(*again == *first);
  {
    auto c = Connect(*again);
    REQUIRE(c.ok());
    auto got = (*c)->Get("key");
    REQUIRE(got.ok());
    CHECK(*got == "round 3");
  }
  // The next round: a new store, without the last one's keys.
  auto next = host.Serve(4, Loopback());
  REQUIRE(next.ok());
  CHECK(host.round() == 4);
  auto c = Connect(*next);
  REQUIRE(c.ok());
  auto there = (*c)->Check({"key"});
  REQUIRE(there.ok());
  CHECK_FALSE(*there);
  host.Stop();
  CHECK_FALSE(host.serving());
  CHECK(host.round() == -1);
}

TEST_CASE("round store: on the caller's loop, and a start that fails says why", "[round_store]") {
  boost::asio::io_context io;
  RoundStoreHost host(&io);
  auto port = host.Serve(0, Loopback());
  REQUIRE(port.ok());
  // The store answers once the loop runs: a client on another thread, the loop here.
  std::string got;
  std::thread client([&] {
    auto c = Connect(*port);
    if (c.ok() && (*c)->Set("k", "v").ok()) {
      auto v = (*c)->Get("k");
      if (v.ok()) got = *v;
    }
    boost::asio::post(io, [&] { io.stop(); });
  });
  io.run_for(std::chrono::seconds(10));
  client.join();
  CHECK(got == "v");

  // An address that is not this host's (TEST-NET-3): the store cannot start there, and the
  // one of the round before is gone.
  RoundStoreSpec elsewhere = Loopback();
  elsewhere.bind_host = "203.0.113.7";
  auto refused = host.Serve(1, elsewhere);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("203.0.113.7"));
  CHECK_FALSE(host.serving());
}
