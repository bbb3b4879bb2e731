// StoreServer over real loopback sockets: concurrency, the CANCEL_WAIT race, clients that
// vanish, malformed frames (and that bystanders never notice), both dialects at once, 1.13
// watches, connection limits, IPv6, several instances per process, and the client's connect
// behaviour.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include <boost/asio/post.hpp>

#include "tests/unit/server/raw_client.h"
#include "tests/unit/silent_listener.h"
#include "tests/unit/skip.h"
#include "tests/unit/test_util.h"

namespace {

using namespace std::chrono_literals;
using crun::StatusCode;
using crun::testing::ConnectClient;
using crun::testing::Eventually;
using crun::testing::RawClient;
using crun::testing::StartServer;
using crun::wire::Command;
using crun::wire::Dialect;
using crun::wire::MakeRequest;

RawClient Modern(std::uint16_t port) {
  RawClient c("127.0.0.1", port);
  c.Validate();
  return c;
}

bool Ipv6LoopbackAvailable() {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

TEST_CASE("many waiters on overlapping keys are each woken exactly once", "[server]") {
  auto server = StartServer();
  constexpr int kWaiters = 64;
  constexpr int kKeys = 10;
  std::mt19937 rng(7);
  std::vector<RawClient> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(Modern(server->port()));
    std::vector<std::string> keys;
    for (int k = 0; k < kKeys; ++k) {
      if (rng() % 2 == 0) keys.push_back("k" + std::to_string(k));
    }
    keys.push_back("k" + std::to_string(i % kKeys));  // never empty, overlapping
    waiters.back().SendRequest(Dialect::kModern, MakeRequest(Command::kWait, keys));
  }
  REQUIRE(Eventually([&] { return server->stats().pending_waits == kWaiters; }));
  auto writer = Modern(server->port());
  for (int k = 0; k < kKeys; ++k) {
    writer.SendRequest(Dialect::kModern,
                       MakeRequest(Command::kSet, {"k" + std::to_string(k), "v"}));
  }
  for (auto& w : waiters) {
    CHECK(w.ReadU8() == crun::wire::kStopWaiting);
    w.ExpectInSync();  // exactly one reply byte, nothing stray behind it
  }
  CHECK(server->stats().pending_waits == 0);
}

TEST_CASE("CANCEL_WAIT racing a SET gives STOP_WAITING at most once, then WAIT_CANCELED",
          "[server]") {
  auto server = StartServer();
  auto waiter = Modern(server->port());
  auto setter = Modern(server->port());
  int raced = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string key = "race" + std::to_string(i);
    waiter.SendRequest(Dialect::kModern, MakeRequest(Command::kWait, {key}));
    // Fire both at once from two threads; either order is legal, the bytes must match it.
    std::thread t([&] {
      setter.SendRequest(Dialect::kModern, MakeRequest(Command::kSet, {key, "v"}));
    });
    waiter.SendRequest(Dialect::kModern, MakeRequest(Command::kCancelWait));
    t.join();
    auto first = waiter.ReadU8();
    if (first == crun::wire::kStopWaiting) {
      ++raced;
      CHECK(waiter.ReadU8() == crun::wire::kWaitCanceled);
    } else {
      CHECK(first == crun::wire::kWaitCanceled);
    }
    waiter.ExpectInSync();
  }
  INFO("waits completed before their cancel: " << raced << " of 300");
  CHECK(server->stats().pending_waits == 0);
}

TEST_CASE("CANCEL_WAIT with nothing pending is still answered", "[server]") {
  auto server = StartServer();
  auto c = Modern(server->port());
  c.SendRequest(Dialect::kModern, MakeRequest(Command::kCancelWait));
  CHECK(c.ReadU8() == crun::wire::kWaitCanceled);
  c.ExpectInSync();
}

TEST_CASE("clients that disconnect while waiting leave nothing behind", "[server]") {
  auto server = StartServer();
  {
    std::vector<RawClient> quitters;
    for (int i = 0; i < 50; ++i) {
      quitters.push_back(Modern(server->port()));
      quitters.back().SendRequest(Dialect::kModern,
                                  MakeRequest(Command::kWait, {"gone", "k" + std::to_string(i)}));
      quitters.back().SendRequest(Dialect::kModern, MakeRequest(Command::kBarrier, {"bar"}, 1000));
    }
    REQUIRE(Eventually([&] { return server->stats().pending_waits == 100; }));
  }  // all closed here
  REQUIRE(Eventually([&] { return server->stats().open_connections == 0; }));
  CHECK(server->stats().pending_waits == 0);
  auto c = ConnectClient(server->port());
  REQUIRE(c->Set("gone", "now").ok());
  CHECK(*c->Get("gone") == "now");
}

TEST_CASE("a malformed frame closes only its own connection", "[server]") {
  struct Case {
    const char* name;
    std::string bytes;
  };
  auto u64 = [](std::uint64_t v) {
    std::string s;
    crun::wire::AppendU64(&s, v);
    return s;
  };
  const std::string modern("\x00\xce\xf7\x85\x3c", 5);
  std::vector<Case> cases = {
      {"garbage first byte", "\x7fGARBAGE"},
      {"unknown 2.x command", modern + "\x55"},
      {"absurd key length", modern + "\x01" + u64(1ULL << 62)},
      {"absurd value length", modern + "\x01" + u64(1) + "k" + u64(1ULL << 40)},
      {"too many keys", modern + "\x06" + u64(1ULL << 30)},
      {"bad VALIDATE magic", modern + std::string("\x00\x01\x02\x03\x04", 5)},
      {"1.13 unknown command", std::string("\x06", 1) + "\x0c"},
      {"ADD on a non-number",
       modern + "\x01" + u64(2) + "/t" + u64(3) + "abc" + "\x04" + u64(2) + "/t" + u64(1)},
  };
  auto server = StartServer();
  // A bystander with a pending wait must get its answer as if nothing happened.
  auto bystander = Modern(server->port());
  bystander.SendRequest(Dialect::kModern, MakeRequest(Command::kWait, {"/after"}));
  std::uint64_t errors = 0;
  for (const auto& c : cases) {
    INFO(c.name);
    RawClient bad("127.0.0.1", server->port());
    bad.Send(c.bytes);
    CHECK(bad.ClosedByPeer());
    CHECK(server->stats().protocol_errors == ++errors);
  }
  auto writer = ConnectClient(server->port());
  REQUIRE(writer->Set("/after", "1").ok());
  CHECK(bystander.ReadU8() == crun::wire::kStopWaiting);
  bystander.ExpectInSync();
}

TEST_CASE("the store byte limit closes only the writer's connection", "[server]") {
  crun::StoreServerOptions options;
  options.limits.max_store_bytes = 1000;
  auto server = StartServer(options);
  auto ok = ConnectClient(server->port());
  REQUIRE(ok->Set("/small", std::string(500, 's')).ok());
  RawClient greedy("127.0.0.1", server->port());
  greedy.Validate();
  greedy.SendRequest(Dialect::kModern, MakeRequest(Command::kSet, {"/big", std::string(600, 'b')}));
  CHECK(greedy.ClosedByPeer());
  CHECK(server->stats().protocol_errors == 1);
  CHECK(*ok->Get("/small") == std::string(500, 's'));
  CHECK_FALSE(*ok->Check({"/big"}));
  CHECK(server->stats().stored_bytes == 6 + 500);
}

TEST_CASE("a request split into one-byte TCP segments is served", "[server]") {
  auto server = StartServer();
  RawClient c("127.0.0.1", server->port());
  std::string stream("\x00\xce\xf7\x85\x3c", 5);
  crun::wire::EncodeRequest(Dialect::kModern, MakeRequest(Command::kSet, {"/split", "value"}),
                            &stream);
  crun::wire::EncodeRequest(Dialect::kModern, MakeRequest(Command::kGet, {"/split"}), &stream);
  for (char byte : stream) c.Send(std::string_view(&byte, 1));  // TCP_NODELAY: one segment each
  CHECK(c.ReadBytes() == "value");
}

TEST_CASE("1.13 and 2.x clients share one store", "[server]") {
  auto server = StartServer();
  RawClient legacy("127.0.0.1", server->port());
  RawClient idle("127.0.0.1", server->port());  // 1.13's silent second connection
  auto modern = Modern(server->port());
  legacy.SendRequest(Dialect::kLegacy, MakeRequest(Command::kAdd, {"init/"}, 1));
  CHECK(legacy.ReadI64() == 1);
  modern.SendRequest(Dialect::kModern, MakeRequest(Command::kAdd, {"init/"}, 1));
  CHECK(modern.ReadI64() == 2);
  legacy.SendRequest(Dialect::kLegacy, MakeRequest(Command::kSet, {"/a", "xy"}));
  // SET has no reply and travels on another connection: wait for it, as real clients do.
  modern.SendRequest(Dialect::kModern, MakeRequest(Command::kWait, {"/a"}));
  CHECK(modern.ReadU8() == crun::wire::kStopWaiting);
  modern.SendRequest(Dialect::kModern, MakeRequest(Command::kGet, {"/a"}));
  CHECK(modern.ReadBytes() == "xy");
  legacy.SendRequest(Dialect::kLegacy, MakeRequest(Command::kWait, {"/b"}));
  modern.SendRequest(Dialect::kModern, MakeRequest(Command::kSet, {"/b", "1"}));
  CHECK(legacy.ReadU8() == crun::wire::kStopWaiting);
  legacy.SendRequest(Dialect::kLegacy, MakeRequest(Command::kGetNumKeys));
  CHECK(legacy.ReadI64() == 3);
  legacy.SendRequest(Dialect::kLegacy, MakeRequest(Command::kDeleteKey, {"/a"}));
  CHECK(legacy.ReadI64() == 1);
  legacy.SendRequest(Dialect::kLegacy, MakeRequest(Command::kCompareSet, {"/b", "1", "2"}));
  CHECK(legacy.ReadBytes() == "2");
  legacy.SendRequest(Dialect::kLegacy, MakeRequest(Command::kCheck, {"/a"}));
  CHECK(legacy.ReadU8() == crun::wire::kCheckNotReady);
  CHECK(server->stats().open_connections == 3);
}

TEST_CASE("1.13 WATCH_KEY registers and then reports every change", "[server]") {
  auto server = StartServer();
  RawClient watcher("127.0.0.1", server->port());
  watcher.SendRequest(Dialect::kLegacy, MakeRequest(Command::kWatchKey, {"/w"}));
  CHECK(watcher.ReadU8() == static_cast<std::uint8_t>(crun::wire::WatchEvent::kRegistered));
  auto writer = ConnectClient(server->port());
  REQUIRE(writer->Set("/w", "1").ok());
  REQUIRE(writer->Set("/w", "2").ok());
  REQUIRE(*writer->DeleteKey("/w"));
  auto expect = [&](crun::wire::WatchEvent e, const char* old_value, const char* new_value) {
    CHECK(watcher.ReadU8() == static_cast<std::uint8_t>(e));
    CHECK(watcher.ReadBytes() == "/w");
    CHECK(watcher.ReadBytes() == old_value);
    CHECK(watcher.ReadBytes() == new_value);
  };
  expect(crun::wire::WatchEvent::kCreated, "", "1");
  expect(crun::wire::WatchEvent::kUpdated, "1", "2");
  expect(crun::wire::WatchEvent::kDeleted, "2", "");
}

TEST_CASE("connections past the limit are refused cleanly and counted", "[server]") {
  crun::StoreServerOptions options;
  options.max_connections = 4;
  auto server = StartServer(options);
  std::vector<std::unique_ptr<crun::TcpStoreClient>> held;
  for (int i = 0; i < 4; ++i) held.push_back(ConnectClient(server->port()));
  RawClient extra("127.0.0.1", server->port());
  CHECK(extra.ClosedByPeer());
  auto stats = server->stats();
  CHECK(stats.refused == 1);
  CHECK(stats.open_connections == 4);
  // The held ones keep working, and a freed slot is usable again.
  REQUIRE(held[0]->Set("k", "v").ok());
  held.pop_back();
  REQUIRE(Eventually([&] { return server->stats().open_connections == 3; }));
  auto again = ConnectClient(server->port());
  CHECK(*again->Get("k") == "v");
}

TEST_CASE("a client that stops reading is throttled, others are not, and it resumes", "[server]") {
  auto server = StartServer();
  auto c = ConnectClient(server->port());
  const std::string big(1 << 20, 'b');
  REQUIRE(c->Set("/big", big).ok());
  REQUIRE(c->Get("/big").ok());  // stored before the hog asks for it
  RawClient hog("127.0.0.1", server->port());
  hog.Validate();
  std::string burst;
  for (int i = 0; i < 64; ++i) {
    crun::wire::EncodeRequest(Dialect::kModern, MakeRequest(Command::kGet, {"/big"}), &burst);
  }
  hog.Send(burst);  // 64 MiB of replies that nobody reads yet
  REQUIRE(Eventually([&] { return server->stats().read_pauses >= 1; }));
  for (int i = 0; i < 100; ++i) REQUIRE(*c->Add("/n", 1) == i + 1);
  // Sent while the server is not reading from the hog: it must still be seen once the hog
  // drains its replies, although no new data arrives to announce it.
  std::string late;
  crun::wire::EncodeRequest(Dialect::kModern, MakeRequest(Command::kAdd, {"/n"}, 1000), &late);
  hog.Send(late);
  for (int i = 0; i < 64; ++i) REQUIRE(hog.ReadBytes() == big);
  CHECK(hog.ReadI64() == 1100);
  hog.ExpectInSync();
}

TEST_CASE("a burst larger than one read budget is served without further data", "[server]") {
  auto server = StartServer();
  RawClient c("127.0.0.1", server->port());
  c.Validate();
  // ~1 MiB of small requests at once: more than the session reads per wake-up.
  std::string burst;
  constexpr int kRequests = 40000;
  for (int i = 0; i < kRequests; ++i) {
    crun::wire::EncodeRequest(Dialect::kModern, MakeRequest(Command::kAdd, {"/count"}, 1), &burst);
  }
  REQUIRE(burst.size() > 4 * 64 * 1024);
  c.Send(burst);
  for (int i = 1; i <= kRequests; ++i) REQUIRE(c.ReadI64() == i);
  c.ExpectInSync();
}

TEST_CASE("several store instances in one process are independent", "[server]") {
  boost::asio::io_context io;
  crun::StoreServerOptions options;
  options.host = "127.0.0.1";
  auto a = crun::StoreServer::Start(io, options);
  auto b = crun::StoreServer::Start(io, options);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  std::thread loop([&] { io.run(); });
  auto ca = ConnectClient((*a)->port());
  auto cb = ConnectClient((*b)->port());
  REQUIRE(ca->Set("/attempt", "0").ok());
  CHECK(*cb->Check({"/attempt"}) == false);
  REQUIRE(cb->Set("/attempt", "1").ok());
  CHECK(*ca->Get("/attempt") == "0");
  boost::asio::post(io, [&] {
    (*a)->Stop();
    (*b)->Stop();
  });
  loop.join();
  // Stopped servers close their clients' connections.
  CHECK_FALSE(ca->Add("/x", 1).ok());
}

TEST_CASE("a backlog longer than one accept budget is drained without new arrivals", "[server]") {
  boost::asio::io_context io;
  crun::StoreServerOptions options;
  options.host = "127.0.0.1";
  auto server = crun::StoreServer::Start(io, options);
  REQUIRE(server.ok());
  // Hold the event loop so that every connection below waits in the listen backlog.
  std::promise<void> release;
  std::promise<void> holding;
  boost::asio::post(io, [&] {
    holding.set_value();
    release.get_future().wait_for(60s);  // a deadline, should the test fail before releasing
  });
  std::thread loop([&] { io.run(); });
  REQUIRE(holding.get_future().wait_for(30s) == std::future_status::ready);
  constexpr int kClients = 600;  // well over the 256 accepts per wake-up
  std::vector<RawClient> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back("127.0.0.1", (*server)->port());
    clients.back().Validate();
  }
  release.set_value();
  // Every queued connection is accepted and answered, though nothing new arrives.
  for (auto& c : clients) c.ExpectInSync();
  boost::asio::post(io, [&] { (*server)->Stop(); });
  loop.join();
}

TEST_CASE("IPv6: bind ::1, and '::' serves IPv4 clients too", "[server][may-skip]") {
  if (!Ipv6LoopbackAvailable()) crun::testing::Skip("no IPv6 loopback on this machine");
  crun::StoreServerOptions v6;
  v6.host = "::1";
  auto server = crun::BackgroundStoreServer::Start(v6);
  REQUIRE(server.ok());
  CHECK((*server)->endpoint().starts_with("[::1]:"));
  auto c = ConnectClient((*server)->port(), 30s, "::1");
  REQUIRE(c->Set("/six", "6").ok());
  CHECK(*c->Get("/six") == "6");

  crun::StoreServerOptions dual;
  dual.host = "::";
  auto any = crun::BackgroundStoreServer::Start(dual);
  REQUIRE(any.ok());
  auto four = ConnectClient((*any)->port(), 30s, "127.0.0.1");
  auto six = ConnectClient((*any)->port(), 30s, "::1");
  REQUIRE(four->Set("/k", "v").ok());
  CHECK(*six->Get("/k") == "v");
}

TEST_CASE("bad server options are refused with the value named", "[server]") {
  crun::StoreServerOptions o;
  o.host = "no-such-host.invalid";
  auto r = crun::BackgroundStoreServer::Start(o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("no-such-host.invalid"));

  auto first = StartServer();
  crun::StoreServerOptions taken;
  taken.host = "127.0.0.1";
  taken.port = first->port();
  auto clash = crun::BackgroundStoreServer::Start(taken);
  REQUIRE_FALSE(clash.ok());
  CHECK_THAT(clash.status().message(),
             Catch::Contains("127.0.0.1:" + std::to_string(first->port())));

  crun::StoreServerOptions limits;
  limits.limits.max_request_bytes = 10;
  CHECK_FALSE(crun::BackgroundStoreServer::Start(limits).ok());
}

// A port a store just left: nothing listens there (unless another process takes it at once).
std::uint16_t FreedPort() { return StartServer()->port(); }

TEST_CASE("client: nothing listening -> timeout naming host:port after retries", "[client]") {
  const std::uint16_t port = FreedPort();
  crun::TcpStoreClientOptions o;
  o.port = port;
  o.connect_timeout = 300ms;
  auto r = crun::TcpStoreClient::Connect(o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kTimeout);
  CHECK_THAT(r.status().message(), Catch::Contains("127.0.0.1:" + std::to_string(port)));
  CHECK_THAT(r.status().message(), Catch::Contains("attempts"));
}

TEST_CASE("client: keeps retrying until the store comes up", "[client]") {
  const std::uint16_t port = FreedPort();
  std::atomic<int> refusals{0};
  std::atomic<bool> connected{false};
  std::string last_failure;
  std::thread t([&] {
    crun::TcpStoreClientOptions o;
    o.port = port;
    o.connect_timeout = 30s;
    o.on_retry = [&](int attempt, const crun::Status& failure) {
      if (attempt == 1) last_failure = failure.message();
      refusals.store(attempt);
    };
    auto c = crun::TcpStoreClient::Connect(o);
    connected = c.ok() && (*c)->Set("/k", "v").ok();
  });
  // The client has been refused at least once before the store exists.
  REQUIRE(Eventually([&] { return refusals.load() >= 1; }));
  crun::StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  // The port was just freed; if another process grabbed it, this test cannot run as written.
  auto late = crun::BackgroundStoreServer::Start(o);
  REQUIRE(late.ok());
  t.join();
  CHECK(connected.load());
  CHECK_THAT(last_failure, Catch::Contains("127.0.0.1:" + std::to_string(port)));
}

TEST_CASE("client: ConnectWhile stops at the first 'no', times out naming the store", "[client]") {
  const std::uint16_t port = FreedPort();
  crun::TcpStoreClientOptions o;
  o.port = port;
  o.connect_timeout = 30s;
  int asked = 0;
  auto stopped = crun::ConnectWhile(o, 20ms, [&] { return ++asked < 3; });
  REQUIRE_FALSE(stopped.ok());
  CHECK(stopped.status().code() == StatusCode::kAborted);
  CHECK(asked == 3);

  o.connect_timeout = 200ms;
  auto late = crun::ConnectWhile(o, 20ms, [] { return true; });
  REQUIRE_FALSE(late.ok());
  CHECK(late.status().code() == StatusCode::kTimeout);
  CHECK_THAT(late.status().message(),
             Catch::Contains("the store at 127.0.0.1:" + std::to_string(port) +
                             " did not answer within 200 ms"));

  auto server = StartServer();
  o.port = server->port();
  auto up = crun::ConnectWhile(o, 20ms, [] { return false; });
  REQUIRE(up.ok());
  CHECK((*up)->Set("/k", "v").ok());
}

TEST_CASE("client: ConnectWhile leaves a store that takes connections and never answers",
          "[client]") {
  // The handshake waits for a reply that never comes.
  crun::testing::SilentListener silent;
  crun::TcpStoreClientOptions o;
  o.port = silent.port();
  o.connect_timeout = 30s;
  o.timeout = 50ms;  // the handshake's wait: one slice
  int asked = 0;
  auto r = crun::ConnectWhile(o, 50ms, [&] { return ++asked < 2; });
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kAborted);
  CHECK(asked == 2);
}

TEST_CASE("client: bad options and unresolvable hosts are named", "[client]") {
  crun::TcpStoreClientOptions o;
  o.port = 0;
  CHECK_THAT(crun::TcpStoreClient::Connect(o).status().message(), Catch::Contains("port 0"));
  o.port = 1;
  o.host = "no-such-host.invalid";
  o.connect_timeout = 50ms;
  auto r = crun::TcpStoreClient::Connect(o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("no-such-host.invalid"));
}

TEST_CASE("client: a store that goes away breaks the client with a clear error", "[client]") {
  auto server = StartServer();
  auto c = ConnectClient(server->port());
  REQUIRE(c->Set("/k", "v").ok());
  const auto port = server->port();
  server.reset();
  auto r = c->Add("/k2", 1);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(r.status().message(), Catch::Contains("127.0.0.1:" + std::to_string(port)));
  auto again = c->Get("/k");
  CHECK_THAT(again.status().message(), Catch::Contains("unusable after an earlier failure"));
}

TEST_CASE("an allow-list admits its addresses only, a stranger is closed, counted, harmless",
          "[server]") {
  crun::StoreServerOptions options;
  options.host = "127.0.0.1";
  options.allowed_peers = {"127.0.0.1"};
  auto server = StartServer(options);
  auto member = ConnectClient(server->port());
  REQUIRE(member->Set("k", "v").ok());
  auto stranger = RawClient::From("127.0.0.2", "127.0.0.1", server->port());
  CHECK(stranger.ClosedByPeer());
  auto stats = server->stats();
  CHECK(stats.refused_strangers == 1);
  CHECK(stats.open_connections == 1);
  CHECK(*member->Get("k") == "v");
}

TEST_CASE("an IPv4 client of a dual-stack store matches its IPv4 address on the list", "[server]") {
  crun::StoreServerOptions options;
  options.host = "::";
  options.allowed_peers = {"127.0.0.2"};
  auto started = crun::BackgroundStoreServer::Start(options);  // StartServer would bind 127.0.0.1
  REQUIRE(started.ok());
  auto& server = *started;
  auto member = RawClient::From("127.0.0.2", "127.0.0.1", server->port());
  member.Validate();
  member.ExpectInSync();
  CHECK(RawClient("127.0.0.1", server->port()).ClosedByPeer());
  CHECK(server->stats().refused_strangers == 1);
}

TEST_CASE("an allow-list entry that is not an address is refused with the value named",
          "[server]") {
  crun::StoreServerOptions options;
  options.allowed_peers = {"node-a"};
  boost::asio::io_context io;
  auto s = crun::StoreServer::Start(io, options);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.status().message(), Catch::Contains("'node-a'"));
}

TEST_CASE("connections per address are bounded, other addresses and freed slots go on",
          "[server]") {
  crun::StoreServerOptions options;
  options.max_connections_per_peer = 2;
  auto server = StartServer(options);
  std::vector<std::unique_ptr<crun::TcpStoreClient>> held;
  for (int i = 0; i < 2; ++i) held.push_back(ConnectClient(server->port()));
  CHECK(RawClient("127.0.0.1", server->port()).ClosedByPeer());
  CHECK(server->stats().refused_per_peer == 1);
  // Another address has its own allowance.
  auto other = RawClient::From("127.0.0.3", "127.0.0.1", server->port());
  other.Validate();
  other.ExpectInSync();
  held.pop_back();
  REQUIRE(Eventually([&] { return server->stats().open_connections == 2; }));
  auto again = ConnectClient(server->port());
  REQUIRE(again->Set("k", "v").ok());
  CHECK(server->stats().refused_per_peer == 1);
}

TEST_CASE("waits held per connection and in total are bounded, others carry on", "[server]") {
  crun::StoreServerOptions options;
  options.limits.max_waits_per_connection = 3;
  options.limits.max_pending_waits = 5;
  auto server = StartServer(options);
  auto bystander = ConnectClient(server->port());
  // A client pipelining waits it will never see answered: the fourth closes its connection.
  RawClient greedy = Modern(server->port());
  for (int i = 0; i < 4; ++i) {
    greedy.SendRequest(Dialect::kModern,
                       MakeRequest(Command::kWait, {"/never" + std::to_string(i)}));
  }
  CHECK(greedy.ClosedByPeer());
  REQUIRE(Eventually([&] { return server->stats().pending_waits == 0; }));
  // Across connections: 3 + 2 fill the store's five; the sixth is refused.
  RawClient a = Modern(server->port()), b = Modern(server->port()), c = Modern(server->port());
  for (int i = 0; i < 3; ++i) a.SendRequest(Dialect::kModern, MakeRequest(Command::kWait, {"/x"}));
  for (int i = 0; i < 2; ++i) b.SendRequest(Dialect::kModern, MakeRequest(Command::kWait, {"/x"}));
  REQUIRE(Eventually([&] { return server->stats().pending_waits == 5; }));
  c.SendRequest(Dialect::kModern, MakeRequest(Command::kWait, {"/x"}));
  CHECK(c.ClosedByPeer());
  // The held waits are answered when the key comes, and the bystander never noticed.
  REQUIRE(bystander->Set("/x", "1").ok());
  for (int i = 0; i < 3; ++i) CHECK(a.ReadU8() == crun::wire::kStopWaiting);
  for (int i = 0; i < 2; ++i) CHECK(b.ReadU8() == crun::wire::kStopWaiting);
  CHECK(*bystander->Get("/x") == "1");
  CHECK(server->stats().protocol_errors == 2);
}

TEST_CASE("a client that sends half a frame and stalls delays nobody", "[server]") {
  auto server = StartServer();
  RawClient slow = Modern(server->port());
  std::string frame;
  crun::wire::EncodeRequest(Dialect::kModern, MakeRequest(Command::kSet, {"/slow", "value"}),
                            &frame);
  slow.Send(frame.substr(0, frame.size() / 2));  // and nothing more, for now
  auto c = ConnectClient(server->port());
  for (int i = 0; i < 1000; ++i) REQUIRE(*c->Add("/n", 1) == i + 1);
  slow.Send(frame.substr(frame.size() / 2));
  slow.ExpectInSync();
  CHECK(*c->Get("/slow") == "value");
}
