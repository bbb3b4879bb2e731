// One contract, several implementations: every case runs against MemoryStore and against
// TcpStoreClient talking to crun's StoreServer over loopback (and PrefixStore over each).
// The stock PyTorch clients run the same ground in tests/compat.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "rendezvous/store/memory_store.h"
#include "rendezvous/store/prefix_store.h"
#include "tests/unit/test_util.h"

namespace {

using namespace std::chrono_literals;
using crun::Millis;
using crun::StatusCode;
using crun::Store;
using crun::testing::Eventually;

// Each fixture hands out "clients": for memory, the one shared store; for TCP, a new
// connection each time (a connection serves one call at a time, like c10d's).
struct MemoryFixture {
  std::shared_ptr<crun::MemoryStore> store = std::make_shared<crun::MemoryStore>();
  std::shared_ptr<Store> Open() { return store; }
  std::size_t PendingWaits() { return store->pending_waits(); }
  std::string Name() const { return "memory"; }
};

struct TcpFixture {
  std::unique_ptr<crun::BackgroundStoreServer> server = crun::testing::StartServer();
  std::shared_ptr<Store> Open() { return crun::testing::ConnectClient(server->port()); }
  std::size_t PendingWaits() { return server->stats().pending_waits; }
  std::string Name() const { return "tcp"; }
};

// The same, seen through PrefixStore("job7/round2", ...).
template <typename Base>
struct Prefixed : Base {
  std::shared_ptr<Store> Open() {
    return std::make_shared<crun::PrefixStore>("job7/round2", Base::Open());
  }
};
using PrefixedMemory = Prefixed<MemoryFixture>;
using PrefixedTcp = Prefixed<TcpFixture>;

#define STORE_CONTRACT(name) \
  TEMPLATE_TEST_CASE(name, "[contract]", MemoryFixture, TcpFixture, PrefixedMemory, PrefixedTcp)

}  // namespace

STORE_CONTRACT("set then get returns the bytes, overwrite replaces them") {
  TestType f;
  auto s = f.Open();
  REQUIRE(s->Set("a", "xy").ok());
  CHECK(*s->Get("a") == "xy");
  REQUIRE(s->Set("a", "zz").ok());
  CHECK(*s->Get("a") == "zz");
  const std::string binary("\0\x01\xff\n", 4);
  REQUIRE(s->Set(std::string("bin\0key", 7), binary).ok());
  CHECK(*s->Get(std::string("bin\0key", 7)) == binary);
  REQUIRE(s->Set("empty", "").ok());
  CHECK(*s->Get("empty") == "");
}

STORE_CONTRACT("get blocks until another client sets the key") {
  TestType f;
  auto reader = f.Open();
  auto writer = f.Open();
  std::string got;
  std::thread t([&] { got = *reader->Get("late"); });
  REQUIRE(Eventually([&] { return f.PendingWaits() == 1; }));
  REQUIRE(writer->Set("late", "here").ok());
  t.join();
  CHECK(got == "here");
  CHECK(f.PendingWaits() == 0);
}

STORE_CONTRACT("get of a missing key times out and names the key") {
  TestType f;
  auto s = f.Open();
  s->set_timeout(50ms);
  auto r = s->Get("never");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kTimeout);
  CHECK_THAT(r.status().message(), Catch::Contains("never"));
  // The store is still usable and holds no stale waiter.
  REQUIRE(s->Set("after", "1").ok());
  CHECK(*s->Get("after") == "1");
  CHECK(f.PendingWaits() == 0);
}

STORE_CONTRACT("compare_set follows the c10d rules") {
  TestType f;
  auto s = f.Open();
  CHECK(*s->CompareSet("k", "", "v1") == "v1");
  CHECK(*s->CompareSet("k", "v1", "v2") == "v2");
  CHECK(*s->CompareSet("k", "wrong", "v3") == "v2");
  CHECK(*s->Get("k") == "v2");
  CHECK(*s->CompareSet("absent", "exp", "des") == "exp");
  CHECK_FALSE(*s->Check({"absent"}));
}

STORE_CONTRACT("add counts in decimal and refuses non-numbers") {
  TestType f;
  auto s = f.Open();
  CHECK(*s->Add("n", 3) == 3);
  CHECK(*s->Add("n", -5) == -2);
  CHECK(*s->Add("n", 0) == -2);
  CHECK(*s->Get("n") == "-2");
  REQUIRE(s->Set("word", "abc").ok());
  CHECK_FALSE(s->Add("word", 1).ok());
}

STORE_CONTRACT("check, wait and their timeouts") {
  TestType f;
  auto s = f.Open();
  CHECK_FALSE(*s->Check({"x", "y"}));
  REQUIRE(s->Set("x", "1").ok());
  CHECK_FALSE(*s->Check({"x", "y"}));
  REQUIRE(s->Set("y", "1").ok());
  CHECK(*s->Check({"x", "y"}));
  CHECK(s->Wait({"x", "y"}, 1s).ok());
  auto timeout = s->Wait({"x", "z"}, 30ms);
  CHECK(timeout.code() == StatusCode::kTimeout);
  CHECK_THAT(timeout.message(), Catch::Contains("z"));
  // After a timeout the same client keeps working (CANCEL_WAIT handshake over TCP).
  CHECK(*s->Add("n", 1) == 1);
  CHECK(f.PendingWaits() == 0);
}

STORE_CONTRACT("wait on several keys returns when the last arrives") {
  TestType f;
  auto waiter = f.Open();
  auto writer = f.Open();
  crun::Status result;
  std::thread t([&] { result = waiter->Wait({"k1", "k2", "k3"}, 20s); });
  REQUIRE(Eventually([&] { return f.PendingWaits() == 1; }));
  REQUIRE(writer->Set("k1", "").ok());
  REQUIRE(writer->Add("k2", 1).ok());
  REQUIRE(writer->Append("k3", "x").ok());
  t.join();
  CHECK(result.ok());
}

STORE_CONTRACT("num_keys and delete_key") {
  TestType f;
  auto s = f.Open();
  const auto base = *s->NumKeys();
  REQUIRE(s->Set("a", "1").ok());
  REQUIRE(s->Set("b", "1").ok());
  CHECK(*s->NumKeys() == base + 2);
  CHECK(*s->DeleteKey("a"));
  CHECK_FALSE(*s->DeleteKey("a"));
  CHECK(*s->NumKeys() == base + 1);
  CHECK_FALSE(*s->Check({"a"}));
}

STORE_CONTRACT("append creates and concatenates") {
  TestType f;
  auto s = f.Open();
  REQUIRE(s->Append("log", "a").ok());
  REQUIRE(s->Append("log", "bc").ok());
  CHECK(*s->Get("log") == "abc");
}

STORE_CONTRACT("multi_set and multi_get") {
  TestType f;
  auto s = f.Open();
  REQUIRE(s->MultiSet({"m1", "m2", "m3"}, {"1", "", "3"}).ok());
  CHECK(*s->MultiGet({"m3", "m1", "m2"}) == std::vector<std::string>{"3", "1", ""});
  CHECK_FALSE(s->MultiSet({"a"}, {}).ok());
}

STORE_CONTRACT("queues: push, pop, len, blocking pop") {
  TestType f;
  auto s = f.Open();
  CHECK(*s->QueueLen("q") == 0);
  auto empty = s->QueuePop("q", false);
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().code() == StatusCode::kNotFound);
  REQUIRE(s->QueuePush("q", "one").ok());
  REQUIRE(s->QueuePush("q", "two").ok());
  CHECK(*s->QueueLen("q") == 2);
  CHECK(*s->QueuePop("q", false) == "one");
  CHECK(*s->QueuePop("q", true) == "two");

  auto popper = f.Open();
  std::string got;
  std::thread t([&] { got = *popper->QueuePop("q", true); });
  REQUIRE(Eventually([&] { return f.PendingWaits() == 1; }));
  REQUIRE(s->QueuePush("q", "three").ok());
  t.join();
  CHECK(got == "three");
}

STORE_CONTRACT("list_keys lists what was set") {
  TestType f;
  auto s = f.Open();
  REQUIRE(s->Set("b", "1").ok());
  REQUIRE(s->Set("a", "1").ok());
  auto keys = *s->ListKeys();
  CHECK(std::find(keys.begin(), keys.end(), "a") != keys.end());
  CHECK(std::find(keys.begin(), keys.end(), "b") != keys.end());
}

STORE_CONTRACT("barrier releases all parties together") {
  TestType f;
  constexpr int kParties = 6;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kParties; ++i) clients.push_back(f.Open());
  std::atomic<int> passed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kParties - 1; ++i) {
    threads.emplace_back([&, i] {
      if (clients[i]->Barrier("bar", kParties, 20s).ok()) passed.fetch_add(1);
    });
  }
  REQUIRE(Eventually([&] { return f.PendingWaits() == kParties - 1; }));
  CHECK(passed.load() == 0);
  REQUIRE(clients.back()->Barrier("bar", kParties, 20s).ok());
  for (auto& t : threads) t.join();
  CHECK(passed.load() == kParties - 1);
  auto late = f.Open()->Barrier("other", 2, 30ms);
  CHECK(late.code() == StatusCode::kTimeout);
}

STORE_CONTRACT("concurrent adds from many clients lose nothing") {
  TestType f;
  constexpr int kClients = 16;
  constexpr int kAdds = 200;
  std::vector<std::thread> threads;
  // Catch2's assertions are not thread-safe: the threads count, the main thread checks.
  std::atomic<int> failed{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&] {
      auto s = f.Open();
      for (int j = 0; j < kAdds; ++j) {
        if (!s->Add("counter", 1).ok()) failed.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed.load() == 0);
  CHECK(*f.Open()->Add("counter", 0) == kClients * kAdds);
}

TEST_CASE("PrefixStore writes c10d key names into the base store", "[contract]") {
  auto base = std::make_shared<crun::MemoryStore>();
  crun::PrefixStore outer("default_pg", base);
  auto inner =
      std::make_shared<crun::PrefixStore>("0/",
                                          std::make_shared<crun::PrefixStore>("default_pg", base));
  REQUIRE(outer.Set("k", "1").ok());
  REQUIRE(inner->Set("cpu/", "2").ok());
  CHECK(*base->ListKeys() == std::vector<std::string>{"default_pg/0//cpu/", "default_pg/k"});
  CHECK(*outer.ListKeys() == std::vector<std::string>{"0//cpu/", "k"});
  CHECK(*outer.NumKeys() == 2);  // counts the whole base store, as c10d does
}
