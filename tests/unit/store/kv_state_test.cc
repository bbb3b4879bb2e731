// KvState's waiter bookkeeping, directly: exactly-once wakeups, cancellation, listeners that go
// away, barriers, queues and 1.13 watch events. No sockets, no threads.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "rendezvous/store/kv_state.h"

namespace {

using crun::KvState;
using crun::StatusCode;
using crun::wire::WatchEvent;

struct Recorder final : crun::StoreListener {
  int woken = 0;
  std::vector<std::string> events;
  void OnWaitDone() override { ++woken; }
  void OnWatchEvent(WatchEvent e, std::string_view key, std::string_view old_value,
                    std::string_view new_value) override {
    events.push_back(std::to_string(static_cast<int>(e)) + ":" + std::string(key) + ":" +
                     std::string(old_value) + ":" + std::string(new_value));
  }
};

constexpr std::uint64_t kBig = 1 << 30;

}  // namespace

TEST_CASE("a wait on several keys fires once, when the last one arrives", "[kv]") {
  KvState s(kBig);
  Recorder r;
  REQUIRE_FALSE(s.Wait({"a", "b", "c"}, &r));
  REQUIRE(s.Set("a", "1").ok());
  REQUIRE(s.Set("b", "1").ok());
  CHECK(r.woken == 0);
  REQUIRE(s.Set("c", "1").ok());
  CHECK(r.woken == 1);
  REQUIRE(s.Set("c", "2").ok());
  REQUIRE(s.Set("a", "2").ok());
  CHECK(r.woken == 1);
  CHECK(s.pending_waits() == 0);
}

TEST_CASE("a wait on existing keys is ready at once and registers nothing", "[kv]") {
  KvState s(kBig);
  Recorder r;
  REQUIRE(s.Set("a", "").ok());
  CHECK(s.Wait({"a"}, &r));
  CHECK(s.Wait({}, &r));
  CHECK(s.pending_waits() == 0);
}

TEST_CASE("every write kind wakes waiters", "[kv]") {
  KvState s(kBig);
  Recorder r;
  REQUIRE_FALSE(s.Wait({"set", "add", "append", "cas"}, &r));
  REQUIRE(s.Set("set", "x").ok());
  REQUIRE(s.Add("add", 1).ok());
  REQUIRE(s.Append("append", "x").ok());
  REQUIRE(s.CompareSet("cas", "", "x").ok());
  CHECK(r.woken == 1);
}

TEST_CASE("cancelled and forgotten waits never fire", "[kv]") {
  KvState s(kBig);
  Recorder a, b, c;
  REQUIRE_FALSE(s.Wait({"k"}, &a));
  REQUIRE_FALSE(s.Wait({"k", "j"}, &b));
  REQUIRE_FALSE(s.Wait({"k"}, &c));
  CHECK(s.CancelWaits(&a));
  CHECK_FALSE(s.CancelWaits(&a));  // nothing left to cancel
  s.Forget(&b);
  CHECK(s.pending_waits() == 1);
  REQUIRE(s.Set("k", "v").ok());
  REQUIRE(s.Set("j", "v").ok());
  CHECK(a.woken == 0);
  CHECK(b.woken == 0);
  CHECK(c.woken == 1);
}

TEST_CASE("compare_set follows the c10d rules", "[kv]") {
  KvState s(kBig);
  // absent, expected empty: stores desired
  CHECK(*s.CompareSet("k", "", "first") == "first");
  // present, expected matches: stores desired
  CHECK(*s.CompareSet("k", "first", "second") == "second");
  // present, mismatch: returns current, stores nothing
  CHECK(*s.CompareSet("k", "nope", "third") == "second");
  // absent, expected non-empty: returns expected, stores nothing
  CHECK(*s.CompareSet("missing", "exp", "des") == "exp");
  CHECK(s.Get("missing") == nullptr);
}

TEST_CASE("ADD keeps decimal text and refuses what is not a number", "[kv]") {
  KvState s(kBig);
  CHECK(*s.Add("c", 5) == 5);
  CHECK(*s.Add("c", -7) == -2);
  CHECK(*s.Get("c") == "-2");
  REQUIRE(s.Set("text", "12abc").ok());
  auto bad = s.Add("text", 1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("'12abc'"));
  REQUIRE(s.Set("max", std::to_string(INT64_MAX)).ok());
  CHECK_THAT(s.Add("max", 1).status().message(), Catch::Contains("overflows"));
}

TEST_CASE("a barrier releases every arriver once the count is reached", "[kv]") {
  KvState s(kBig);
  Recorder a, b, c;
  CHECK_FALSE(*s.Barrier("bar", 3, &a));
  CHECK_FALSE(*s.Barrier("bar", 3, &b));
  CHECK(a.woken + b.woken == 0);
  CHECK(*s.Barrier("bar", 3, &c));
  CHECK(a.woken == 1);
  CHECK(b.woken == 1);
  CHECK(c.woken == 0);  // the last arriver is answered directly
  CHECK(*s.Get("bar") == "3");
}

TEST_CASE("QUEUE_PUSH wakes one waiter, pops are FIFO", "[kv]") {
  KvState s(kBig);
  Recorder a, b;
  REQUIRE_FALSE(s.Wait({"q"}, &a));
  REQUIRE_FALSE(s.Wait({"q"}, &b));
  REQUIRE(s.QueuePush("q", "1").ok());
  CHECK(a.woken + b.woken == 1);
  REQUIRE(s.QueuePush("q", "2").ok());
  CHECK(a.woken + b.woken == 2);
  CHECK(s.QueueLen("q") == 2);
  CHECK(s.Check({"q"}));
  std::int64_t before = 0;
  CHECK(*s.QueuePop("q", &before) == "1");
  CHECK(before == 2);
  CHECK(*s.QueuePop("q", &before) == "2");
  CHECK_FALSE(s.QueuePop("q", &before).has_value());
  CHECK(before == 0);
  CHECK(s.NumKeys() == 0);  // queues are not keys
}

TEST_CASE("the byte limit refuses growth but allows shrinking", "[kv]") {
  KvState s(10);
  REQUIRE(s.Set("k", "123456789").ok());  // 10 bytes
  auto full = s.Set("j", "x");
  CHECK(full.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(full.message(), Catch::Contains("limit of 10 bytes"));
  CHECK(s.Set("k", "1").ok());  // shrinking is fine
  CHECK(s.bytes() == 2);
  CHECK(s.DeleteKey("k"));
  CHECK(s.bytes() == 0);
}

TEST_CASE("watchers hear creates, updates and deletes until forgotten", "[kv]") {
  KvState s(kBig);
  Recorder w;
  s.Watch("k", &w);
  REQUIRE(s.Set("k", "1").ok());
  REQUIRE(s.Set("k", "2").ok());
  REQUIRE(s.Add("k", 1).ok());
  CHECK(s.DeleteKey("k"));
  s.Forget(&w);
  REQUIRE(s.Set("k", "9").ok());
  CHECK(w.events == std::vector<std::string>{"1:k::1", "0:k:1:2", "0:k:2:3", "2:k:3:"});
}
