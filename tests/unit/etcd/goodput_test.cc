// The goodput ledgers on etcd (rendezvous/etcd/goodput.h): when a node puts its own, how they
// are read back, the job's combined by the decider at the outcome, and `crun status`.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "rendezvous/etcd/goodput.h"
#include "rendezvous/goodput/ledger_json.h"
#include "tests/unit/etcd/etcd_fake.h"

namespace {

namespace gp = crun::goodput;
using crun::etcd::Clock;

const gp::Ms kLaunch =
    std::chrono::duration_cast<std::chrono::milliseconds>(kWall0.time_since_epoch()).count();

// A node that trained from 1 s to `trained_until` ms after its launch (a step a second), with
// one crash at `crash_at` (0: none) after which it resumed at step 1.
gp::Ledger Trained(const std::string& id, gp::Ms trained_until, gp::Ms crash_at = 0) {
  gp::Ledger l = gp::Ledger::Launched(id, "host-" + id, 1, kLaunch);
  l.Joining(kLaunch);
  l.Assigned(kLaunch + 100, false, 0);
  l.WorkersRunning(kLaunch + 200);
  std::int64_t step = 0;
  for (gp::Ms t = 1000; t <= trained_until; t += 1000) {
    if (crash_at != 0 && t == crash_at) {
      l.FailureKnown(kLaunch + t, kLaunch + t, "exception", "rank 0: ValueError");
      l.Assigned(kLaunch + t + 100, false, 0);
      l.WorkersRunning(kLaunch + t + 200);
      step = 0;
      continue;
    }
    l.Progress(kLaunch + t, 0, ++step);
  }
  return l;
}

gp::NodeLedger Settled(const gp::Ledger& l, const std::string& id) {
  gp::NodeLedger n = l.Settled();
  n.node = id;
  return n;
}

// What the node's key holds of it: no marks.
gp::NodeLedger Unmarked(gp::NodeLedger n) {
  n.saves.clear();
  n.steps.clear();
  return n;
}

}  // namespace

TEST_CASE(
    "etcd goodput: a node puts its ledger at each incident, its first training, its end, "
    "and else once a minute") {
  crun::etcd::LedgerPuts puts;
  const Clock::time_point t0{std::chrono::hours(10)};
  gp::Ledger l = gp::Ledger::Launched("a", "host-a", 1, kLaunch);
  l.Joining(kLaunch);
  l.Assigned(kLaunch + 100, false, 0);
  l.WorkersRunning(kLaunch + 200);
  const auto first = puts.Offer(t0, Settled(l, "a"));
  REQUIRE(first);  // the first: at once
  l.Progress(kLaunch + 900, 0, 1);
  // Not trained yet (the first progress ends starting): the same marks, a second later.
  CHECK_FALSE(puts.Offer(t0 + std::chrono::seconds(1), Settled(l, "a")));
  l.Saved(kLaunch + 1500, 1);
  l.Progress(kLaunch + 1900, 0, 2);
  REQUIRE_FALSE(Settled(l, "a").saves.empty());
  const auto trained = puts.Offer(t0 + std::chrono::seconds(2), Settled(l, "a"));
  REQUIRE(trained);  // the first training
  // The marks (saves, step points) are the node's own timeline's: not in its key.
  const auto j = nlohmann::json::parse(*trained);
  CHECK(j.at("saves_ms").empty());
  CHECK(j.at("steps").empty());
  CHECK(gp::NodeFromJson(j).ok());

  l.Progress(kLaunch + 2900, 0, 3);
  CHECK_FALSE(puts.Offer(t0 + std::chrono::seconds(30), Settled(l, "a")));
  // Held for the node's report, which puts the ledger as it stood just before, once.
  const auto held = puts.Flush();
  REQUIRE(held);
  CHECK(gp::NodeFromJson(nlohmann::json::parse(*held))->until == kLaunch + 2900);
  CHECK_FALSE(puts.Flush());
  CHECK(puts.Offer(t0 + std::chrono::seconds(2) + crun::etcd::kLedgerRefresh, Settled(l, "a")));
  const auto t1 = t0 + std::chrono::seconds(2) + crun::etcd::kLedgerRefresh;

  l.FailureKnown(kLaunch + 3500, kLaunch + 3400, "signal", "rank 0: SIGKILL");
  CHECK(puts.Offer(t1 + std::chrono::seconds(1), Settled(l, "a")));  // begun: at once
  l.Assigned(kLaunch + 3600, false, 0);
  l.WorkersRunning(kLaunch + 3700);
  CHECK_FALSE(puts.Offer(t1 + std::chrono::seconds(2), Settled(l, "a")));
  l.Progress(kLaunch + 4700, 0, 3);
  l.Progress(kLaunch + 5700, 0, 4);
  CHECK(puts.Offer(t1 + std::chrono::seconds(3), Settled(l, "a")));  // ended: at once
  l.Finished(kLaunch + 6000);
  CHECK(puts.Offer(t1 + std::chrono::seconds(4), Settled(l, "a")));  // the end: at once
  CHECK_FALSE(puts.Offer(t1 + std::chrono::seconds(5), Settled(l, "a")));
}

TEST_CASE(
    "etcd goodput: ledgers are read back, a node still there carried on to now, a bad "
    "value named and left out") {
  Etcd e;
  e.AddNode("a", "host-a", 1, 2, 2);  // a runs; b's key is gone (lost), its ledger stays
  const gp::NodeLedger a = Settled(Trained("a", 5000), "a");
  const gp::NodeLedger b = Settled(Trained("b", 4000), "b");
  e.Put(crun::etcd::LedgerKey(e.keys, "a"), crun::etcd::EncodeLedger(a));
  e.Put(crun::etcd::LedgerKey(e.keys, "b"), crun::etcd::EncodeLedger(b));
  e.Put(crun::etcd::LedgerKey(e.keys, "c"), "{\"node\": \"c\"}");

  std::vector<std::string> skipped;
  auto as_put = crun::etcd::Ledgers(e.keys, e.kv, std::nullopt, &skipped);
  REQUIRE(as_put.size() == 2);
  CHECK(as_put[0] == Unmarked(a));
  CHECK(as_put[1] == Unmarked(b));
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0].find("ledger/c") != std::string::npos);

  const auto later = kWall0 + std::chrono::seconds(20);
  auto now = crun::etcd::Ledgers(e.keys, e.kv, later);
  REQUIRE(now.size() == 2);
  CHECK(now[0].until == kLaunch + 20'000);  // carried on: a is still there
  CHECK(gp::Sum(now[0].totals) == 20'000);
  CHECK(gp::At(now[0].totals, gp::Category::kTraining) > gp::At(a.totals, gp::Category::kTraining));
  CHECK(now[1] == Unmarked(b));  // lost: as it last said
}

TEST_CASE(
    "etcd goodput: the decider combines the job's ledger with the outcome, for every "
    "node to read at its end") {
  Etcd e;
  e.FormTwo();
  const std::string key = crun::etcd::JobGoodputKey(e.keys);
  e.Put(crun::etcd::LedgerKey(e.keys, "a"),
        crun::etcd::EncodeLedger(Settled(Trained("a", 9000, 4000), "a")));
  e.Put(crun::etcd::LedgerKey(e.keys, "b"),
        crun::etcd::EncodeLedger(Settled(Trained("b", 9000), "b")));
  e.Succeed("a");
  e.Step(Ms(1));
  CHECK(e.kv.count(key) == 0);  // no outcome yet: the job's is status's to combine
  e.Succeed("b");
  const Decision outcome = e.Step(Ms(2));
  REQUIRE(e.Job()["phase"] == "succeeded");
  REQUIRE(e.kv.count(key) == 1);
  const auto written = e.kv.at(key).mod_revision;
  // In the transaction that writes the outcome: every node that reads a/job's has it.
  CHECK(std::any_of(outcome.ops.begin(), outcome.ops.end(),
                    [&](const Op& op) { return op.key == key; }));
  CHECK(std::any_of(outcome.ops.begin(), outcome.ops.end(),
                    [&](const Op& op) { return op.key == e.keys.job(); }));
  auto job = crun::etcd::DecodeJobGoodput(e.kv.at(key).value);
  REQUIRE(job.ok());
  CHECK(job->nodes == 2);
  CHECK(job->job.segments.empty());  // a/goodput does not grow with the nodes' segments
  CHECK(gp::Sum(job->job.totals) == job->job.until - job->job.begin);
  REQUIRE(job->job.incidents.size() == 1);  // a's crash, which held the job back
  CHECK(job->job.incidents[0].kind == "exception");
  CHECK(job->job.steps_known);

  e.Step(Ms(3));  // nothing new: not written again
  CHECK(e.kv.at(key).mod_revision == written);
  // A node's ledger put after the outcome: the job's again.
  e.Put(crun::etcd::LedgerKey(e.keys, "b"),
        crun::etcd::EncodeLedger(Settled(Trained("b", 10'000), "b")));
  e.Step(Ms(4));
  CHECK(e.kv.at(key).mod_revision > written);
  CHECK(
      crun::etcd::DecodeJobGoodput("{\"nodes\": 2}").status().message().find("the job's goodput") !=
      std::string::npos);
}

TEST_CASE("etcd goodput: crun status shows each node's goodput and the job's") {
  Etcd e;
  e.FormTwo();
  auto status = crun::etcd::StatusOf(e.keys, "job1", e.kv, kT0, kWall0);
  REQUIRE(status.ok());
  CHECK_FALSE(status->goodput);  // no ledger yet
  e.Put(crun::etcd::LedgerKey(e.keys, "a"),
        crun::etcd::EncodeLedger(Settled(Trained("a", 9000, 4000), "a")));
  e.Put(crun::etcd::LedgerKey(e.keys, "b"),
        crun::etcd::EncodeLedger(Settled(Trained("b", 9000), "b")));
  status = crun::etcd::StatusOf(e.keys, "job1", e.kv, kT0, kWall0 + std::chrono::seconds(10));
  REQUIRE(status.ok());
  REQUIRE(status->goodput);
  CHECK(status->goodput->known);
  CHECK(status->goodput->incidents == 1);
  CHECK(status->goodput->ratio > 0.3);
  CHECK(status->goodput->ratio < 0.9);
  for (const auto& n : status->nodes) {
    INFO(n.node_id);
    REQUIRE(n.goodput);
    CHECK(n.goodput->incidents == (n.node_id == "a" ? 1 : 0));
  }
}

TEST_CASE(
    "etcd goodput: a new job on the run id starts its ledgers over; binding them to the "
    "retention lease resends no value") {
  Etcd e;
  e.OneSucceeded();
  e.Put(crun::etcd::LedgerKey(e.keys, "a"),
        crun::etcd::EncodeLedger(Settled(Trained("a", 9000), "a")));
  e.Step(Ms(1));  // the outcome: a/goodput written; the retention lease asked for
  auto d = Decide(e.keys, e.kv, kT0 + Ms(2), kWall0 + Ms(2), {std::chrono::seconds(60), 77});
  for (const auto& op : d.ops) {
    INFO(op.key);
    if (op.key == crun::etcd::LedgerKey(e.keys, "a")) {
      CHECK(op.keep_value);  // bound without its value: it may be hundreds of KB
      CHECK(op.value.empty());
      CHECK(op.lease == 77);
    }
  }
  e.Apply(d);
  REQUIRE(e.kv.count(crun::etcd::JobGoodputKey(e.keys)) == 1);
  REQUIRE(e.kv.at(crun::etcd::LedgerKey(e.keys, "a")).lease == 77);
  // Its agents left; a new agent comes: job 2 starts, without job 1's goodput.
  e.Delete(e.keys.node("a"));
  e.AddNode("c", "host-c", 1, 1, 1);
  e.Step(Ms(3));
  CHECK(e.Job()["job"] == 2);
  CHECK(e.kv.count(crun::etcd::LedgerKey(e.keys, "a")) == 0);
  CHECK(e.kv.count(crun::etcd::JobGoodputKey(e.keys)) == 0);
}
