// crun's etcd v3 client (rendezvous/etcd/client.h) against a real etcd (Debian's etcd-server):
// keys, transactions, leases and watches, a member that dies and comes back, and endpoints that
// are dead or are not etcd.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

#include "rendezvous/etcd/client.h"
#include "tests/unit/etcd/etcd_process.h"

namespace {

using crun::etcd::Clock;
using crun::etcd::Compare;
using crun::etcd::Op;
using Ms = std::chrono::milliseconds;

std::shared_ptr<crun::etcd::Client> Connect(std::vector<std::string> endpoints) {
  crun::etcd::ClientOptions o;
  o.endpoints = std::move(endpoints);
  auto c = crun::etcd::Client::Connect(o, Clock::now() + std::chrono::seconds(20));
  REQUIRE(c.ok());
  return *c;
}

Clock::time_point In(Ms ms) { return Clock::now() + ms; }

// What a watch delivered, for the test thread to wait on.
struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<crun::etcd::WatchEvent> events;
  std::optional<crun::Status> error;

  bool WaitFor(std::size_t n, Ms limit = Ms(20'000)) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return events.size() >= n || error; }) &&
           events.size() >= n;
  }
};

}  // namespace

TEST_CASE("etcd client: reads, writes and transactions that compare revisions") {
  crun::testing::EtcdProcess etcd;
  auto c = Connect({etcd.endpoint()});
  auto r1 = c->Put("/t/a", "1", 0, In(Ms(5000)));
  REQUIRE(r1.ok());
  REQUIRE(c->Put("/t/b", "2", 0, In(Ms(5000))).ok());
  REQUIRE(c->Put("/u/c", "3", 0, In(Ms(5000))).ok());
  auto all = c->GetPrefix("/t/", In(Ms(5000)));
  REQUIRE(all.ok());
  REQUIRE(all->kvs.size() == 2);
  CHECK(all->kvs[0].key == "/t/a");
  CHECK(all->kvs[0].mod_revision == *r1);
  CHECK(all->kvs[1].value == "2");

  // Create if absent: once.
  std::vector<Compare> absent = {{"/t/new", Compare::Target::kCreateRevision, 0, ""}};
  auto t1 = c->Txn(absent, {{Op::Kind::kPut, "/t/new", "x", 0}},
                   {{Op::Kind::kGet, "/t/new", "", 0}}, In(Ms(5000)));
  REQUIRE(t1.ok());
  CHECK(t1->succeeded);
  auto t2 = c->Txn(absent, {{Op::Kind::kPut, "/t/new", "y", 0}},
                   {{Op::Kind::kGet, "/t/new", "", 0}}, In(Ms(5000)));
  REQUIRE(t2.ok());
  CHECK_FALSE(t2->succeeded);
  REQUIRE(t2->reads.size() == 1);
  REQUIRE(t2->reads[0].size() == 1);
  CHECK(t2->reads[0][0].value == "x");
  // Compare-and-set on the mod revision: the stale writer loses.
  const auto rev = t2->reads[0][0].mod_revision;
  std::vector<Compare> at = {{"/t/new", Compare::Target::kModRevision, rev, ""}};
  REQUIRE(c->Txn(at, {{Op::Kind::kPut, "/t/new", "z", 0}}, {}, In(Ms(5000)))->succeeded);
  CHECK_FALSE(c->Txn(at, {{Op::Kind::kPut, "/t/new", "w", 0}}, {}, In(Ms(5000)))->succeeded);
  // A prefix deleted in one operation.
  REQUIRE(c->Txn({}, {{Op::Kind::kDeletePrefix, "/t/", "", 0}}, {}, In(Ms(5000)))->succeeded);
  CHECK(c->GetPrefix("/t/", In(Ms(5000)))->kvs.empty());
  CHECK(c->Get("/u/c", In(Ms(5000)))->kvs.size() == 1);
}

TEST_CASE("etcd client: keys bound to a lease go with it") {
  crun::testing::EtcdProcess etcd;
  auto c = Connect({etcd.endpoint()});
  auto lease = c->Grant(std::chrono::seconds(2), In(Ms(5000)));
  REQUIRE(lease.ok());
  REQUIRE(c->Put("/l/k", "v", *lease, In(Ms(5000))).ok());
  CHECK(c->Get("/l/k", In(Ms(5000)))->kvs.at(0).lease == *lease);
  auto ttl = c->KeepAliveOnce(*lease, In(Ms(5000)));
  REQUIRE(ttl.ok());
  CHECK(*ttl >= 1);
  REQUIRE(c->Revoke(*lease, In(Ms(5000))).ok());
  CHECK(c->Get("/l/k", In(Ms(5000)))->kvs.empty());
  auto gone = c->KeepAliveOnce(*lease, In(Ms(5000)));
  CHECK(gone.status().code() == crun::StatusCode::kNotFound);
}

TEST_CASE("etcd client: a watch delivers a prefix's changes in order, across a restart of etcd") {
  crun::testing::EtcdProcess etcd;
  auto c = Connect({etcd.endpoint()});
  auto start = c->GetPrefix("/w/", In(Ms(5000)));
  REQUIRE(start.ok());
  Seen seen;
  auto watch = c->WatchPrefix(
      "/w/", start->revision + 1,
      [&](std::vector<crun::etcd::WatchEvent> events, std::int64_t) {
        std::lock_guard lock(seen.mu);
        for (auto& e : events) seen.events.push_back(std::move(e));
        seen.cv.notify_all();
      },
      [&](crun::Status s) {
        std::lock_guard lock(seen.mu);
        seen.error = s;
        seen.cv.notify_all();
      },
      Ms(30'000));
  REQUIRE(c->Put("/w/1", "a", 0, In(Ms(5000))).ok());
  REQUIRE(c->Put("/other", "x", 0, In(Ms(5000))).ok());
  REQUIRE(c->Txn({}, {{Op::Kind::kDelete, "/w/1", "", 0}}, {}, In(Ms(5000))).ok());
  REQUIRE(seen.WaitFor(2));
  {
    std::lock_guard lock(seen.mu);
    CHECK(seen.events[0].kv.key == "/w/1");
    CHECK_FALSE(seen.events[0].deleted);
    CHECK(seen.events[1].deleted);
  }
  // etcd dies and comes back on the same data: the watch goes on from where it was, and what
  // was written meanwhile (here: right after the restart, before the watch is back) arrives.
  etcd.Kill();
  etcd.Start();
  REQUIRE(c->Put("/w/2", "b", 0, In(Ms(20'000))).ok());
  REQUIRE(seen.WaitFor(3));
  std::lock_guard lock(seen.mu);
  CHECK(seen.events[2].kv.key == "/w/2");
  CHECK(seen.events.size() == 3);
  CHECK_FALSE(seen.error.has_value());
}

TEST_CASE("etcd client: a dead member is passed over for the next one") {
  crun::testing::EtcdProcess etcd;
  const std::string dead = "127.0.0.1:" + std::to_string(crun::testing::FreePort());
  auto c = Connect({dead, etcd.endpoint()});
  for (int i = 0; i < 3; ++i) {
    REQUIRE(c->Put("/d/" + std::to_string(i), "v", 0, In(Ms(10'000))).ok());
  }
  CHECK(c->GetPrefix("/d/", In(Ms(5000)))->kvs.size() == 3);
}

TEST_CASE("etcd client: the calls start at the member given, modulo the members") {
  // Two separate etcds tell the members apart: a key is written to the second only.
  crun::testing::EtcdProcess first, second;
  {
    auto b = Connect({second.endpoint()});
    REQUIRE(b->Put("/m/only-second", "v", 0, In(Ms(5000))).ok());
  }
  for (const std::size_t given : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
    crun::etcd::ClientOptions o;
    o.endpoints = {first.endpoint(), second.endpoint()};
    o.first_member = given;
    auto c = crun::etcd::Client::Connect(o, In(Ms(20'000)));
    REQUIRE(c.ok());
    CHECK((*c)->member() == given % 2);
    auto got = (*c)->Get("/m/only-second", In(Ms(5000)));
    REQUIRE(got.ok());
    CHECK(got->kvs.size() == (given % 2 == 1 ? 1U : 0U));
  }
}

TEST_CASE("etcd client: nobody there, or not etcd there: an error naming the endpoint in time") {
  const std::string dead = "127.0.0.1:" + std::to_string(crun::testing::FreePort());
  crun::etcd::ClientOptions o;
  o.endpoints = {dead};
  const auto t0 = Clock::now();
  auto c = crun::etcd::Client::Connect(o, Clock::now() + Ms(1500));
  CHECK(Clock::now() - t0 < Ms(5000));
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == crun::StatusCode::kUnavailable);
  CHECK(c.status().message().find(dead) != std::string::npos);

  // A server that answers every connection with garbage and closes it.
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor
      acceptor(io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  const std::string garbage = "127.0.0.1:" + std::to_string(acceptor.local_endpoint().port());
  std::function<void()> accept_next = [&] {
    acceptor.async_accept([&](const boost::system::error_code& ec, boost::asio::ip::tcp::socket s) {
      if (ec) return;
      boost::system::error_code ignored;
      boost::asio::write(s, boost::asio::buffer(std::string("HTTP/1.0 200 OK\r\n\r\nhello")),
                         ignored);
      accept_next();
    });
  };
  accept_next();
  std::thread server([&] { io.run(); });
  o.endpoints = {garbage};
  auto g = crun::etcd::Client::Connect(o, Clock::now() + Ms(1500));
  io.stop();
  server.join();
  REQUIRE_FALSE(g.ok());
  CHECK(g.status().message().find(garbage) != std::string::npos);
}
