// The etcd rendezvous's decisions (rendezvous/etcd/job.h) as tables: a mirror of keys as etcd
// would hold them, Decide at invented times, and its writes applied the way a transaction
// would apply them (revisions counted up). The real etcd is in etcd_client_test.cc and the
// integration suite.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <set>

#include "rendezvous/etcd/job.h"
#include "rendezvous/etcd/stragglers.h"
#include "tests/unit/etcd/etcd_fake.h"

namespace {

std::string FailureReport(const std::string& what, int exit_code) {
  Report r;
  r.what = what;
  r.exit_code = exit_code;
  r.report_json = R"({"host":"b","failures":[{"rank":1,"exit_code":3}]})";
  return crun::etcd::EncodeReport(r);
}

// A failure whose exit code is 3 + `n`: each another way, so that no crash loop ends the job.
std::string FailedAnotherWay(int n) {
  Report r;
  r.what = "rank 1 failed";
  r.exit_code = 3 + n;
  r.report_json =
      R"({"host":"b","failures":[{"rank":1,"exit_code":)" + std::to_string(r.exit_code) + "}]}";
  return crun::etcd::EncodeReport(r);
}

}  // namespace

TEST_CASE("etcd job: the first node's settings make the job, a round forms when max nodes join") {
  Etcd e;
  e.AddNode("n-b", "host-b", 2, 2, 2);
  e.AddNode("n-a", "host-a", 3, 2, 2);
  CHECK(crun::etcd::Decider(e.keys, e.kv).empty());
  e.Put(e.keys.decider(), "n-b", 100);
  CHECK(crun::etcd::Decider(e.keys, e.kv) == "n-b");
  e.JoinNode("n-b");
  auto d = e.Step(Ms(0));
  CHECK(d.write);
  CHECK(e.kv.at(e.keys.layout()).value == crun::etcd::kLayout);
  CHECK(e.Job()["phase"] == "gathering");
  CHECK(e.Job()["joined"].size() == 1);
  CHECK(d.wake_at.has_value());  // the join deadline
  e.JoinNode("n-a");
  e.Step(Ms(10));
  auto job = e.Job();
  CHECK(job["phase"] == "running");
  CHECK(job["round"] == 0);
  CHECK(job["world_size"] == 5);
  // Rank order: by host.
  REQUIRE(job["members"].size() == 2);
  CHECK(job["members"][0]["id"] == "n-a");
  CHECK(job["members"][1]["id"] == "n-b");
  auto history = nlohmann::json::parse(e.kv.at(e.keys.round(0)).value);
  CHECK(history["nodes"] == nlohmann::json::array({"n-a", "n-b"}));
  // Nothing new: nothing written.
  CHECK_FALSE(e.Step(Ms(20)).write);
}

TEST_CASE("etcd job: joins carry the ports a node reserved, members carry them to every agent") {
  // --contract jax,horovod: two ports a node (JAX's and Horovod's), whatever its workers.
  Etcd e;
  e.AddNode("n-a", "host-a", 2, 2, 2, 0, 100, "jax,horovod");
  NodeRecord b;
  b.node = {"n-b", "host-b", 1, std::nullopt, "10.0.0.9", {}};
  b.settings.min_nodes = b.settings.max_nodes = 2;
  b.settings.contracts = crun::ParseContracts("jax,horovod").value();
  e.Put(e.keys.node("n-b"), crun::etcd::EncodeNode(b), 100);
  e.Put(e.keys.decider(), "n-a", 100);
  // An agent without ports writes the gathering alone, as agents before --contract did.
  CHECK(crun::etcd::EncodeJoin({0, {}}) == "0");
  e.Put(e.keys.join("n-a"), crun::etcd::EncodeJoin({0, {40000, 40001}}));
  e.Put(e.keys.join("n-b"), crun::etcd::EncodeJoin({0, {41000, 41001}}));
  e.Step(Ms(0));
  const auto members = e.Public()["members"];
  REQUIRE(members.size() == 2);
  CHECK(members[0]["id"] == "n-a");
  CHECK(members[0]["ports"] == nlohmann::json::array({40000, 40001}));
  CHECK(members[1]["address"] == "10.0.0.9");
  CHECK(members[1]["ports"] == nlohmann::json::array({41000, 41001}));
  // Decoded back, as every agent reads a/job.
  auto doc = crun::etcd::DecodeJob(e.kv.at(e.keys.job()).value, kT0, kWall0);
  REQUIRE(doc.ok());
  CHECK(doc->state.members[1].node.ports == std::vector<std::uint16_t>{41000, 41001});
  // Joins as agents write them, and what is refused.
  auto j = crun::etcd::DecodeJoin("n-b", R"({"gathering":3,"ports":[1,65535]})");
  REQUIRE(j.ok());
  CHECK(j->gathering == 3);
  CHECK(j->ports == std::vector<std::uint16_t>{1, 65535});
  CHECK(crun::etcd::DecodeJoin("n-b", "7")->gathering == 7);
  for (const char* bad : {"x", R"({"ports":[1]})", R"({"gathering":1,"ports":[70000]})"}) {
    INFO(bad);
    auto d = crun::etcd::DecodeJoin("n-b", bad);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().message().find("join of 'n-b'") != std::string::npos);
  }
}

TEST_CASE("etcd job: a join whose ports do not fit its contracts is refused, naming them") {
  Etcd e;
  e.AddNode("n-a", "host-a", 2, 1, 1, 0, 100, "tensorflow,jax,horovod");
  e.Put(e.keys.decider(), "n-a", 100);
  e.Put(e.keys.join("n-a"), crun::etcd::EncodeJoin({0, {1, 2, 3}}));  // needs 4
  e.Step(Ms(0));
  REQUIRE(e.kv.count(e.keys.refusal("n-a")) == 1);
  CHECK(e.kv.at(e.keys.refusal("n-a")).value ==
        "3 reserved ports for 2 workers where --contract torch,tensorflow,jax,horovod needs 4");
}

TEST_CASE("etcd job: a worker failure spends a restart and every node rejoins") {
  Etcd e;
  e.AddNode("a", "host-a", 1, 2, 2, /*max_restarts=*/1);
  e.AddNode("b", "host-b", 1, 2, 2, 1);
  e.JoinNode("a");
  e.JoinNode("b");
  e.Step(Ms(0));
  REQUIRE(e.Job()["phase"] == "running");
  e.Put(e.keys.report(0, "b"), FailureReport("rank 1 on host-b failed with exit code 3", 3));
  e.Step(Ms(5));
  auto job = e.Job();
  CHECK(job["phase"] == "gathering");
  CHECK(job["gathering"] == 1);
  CHECK(job["restarts_used"] == 1);
  CHECK(job["stop"]["reason"] == "rank 1 on host-b failed with exit code 3");
  CHECK(job["stop"]["spends_restart"] == true);
  CHECK(job["stop"]["kind"] == "peer");
  CHECK(e.kv.count(e.keys.last_failure()) == 1);
  CHECK(e.kv.count(e.keys.report(0, "b")) == 0);  // the stopped round's reports are cleared
  // Old joins do not count for the new gathering; new ones do.
  CHECK(e.Step(Ms(6)).write == false);
  e.JoinNode("a");
  e.JoinNode("b");
  e.Step(Ms(7));
  CHECK(e.Job()["phase"] == "running");
  CHECK(e.Job()["round"] == 1);
  // The second failure has no restart left: the job fails with the root cause's exit code.
  e.Put(e.keys.report(1, "a"), FailureReport("rank 0 on host-a failed with exit code 3", 3));
  e.Step(Ms(8));
  job = e.Job();
  CHECK(job["phase"] == "failed");
  CHECK(job["outcome"]["success"] == false);
  CHECK(job["outcome"]["exit_code"] == 3);
  CHECK(job["outcome"]["root_node_id"] == "a");
  CHECK(job["outcome"]["root_report"]["host"] == "b");  // the report as the node wrote it
  CHECK(job["outcome"]["reason"].get<std::string>().find("after 1 restarts") != std::string::npos);
}

namespace {

// Nodes a and b join round `attempt` (the decider forms it), then b's workers fail with `r`.
void FailAttempt(Etcd& e, int attempt, const Report& r) {
  e.JoinNode("a");
  e.JoinNode("b");
  e.Step(Ms(10 * attempt));
  REQUIRE(e.Job()["phase"] == "running");
  e.Put(e.keys.report(attempt, "b"), crun::etcd::EncodeReport(r));
  e.Step(Ms(10 * attempt + 5));
}

}  // namespace

TEST_CASE("etcd job: failures the same way before progress end it as a crash loop") {
  // Each failure is decided by a fresh Decide over the stored document: the loop's count
  // lives in the document, as the budget does.
  Etcd e;
  e.AddNode("a", "host-a", 1, 2, 2, /*max_restarts=*/10);
  e.AddNode("b", "host-b", 1, 2, 2, 10);
  Report r;
  r.what = "rank 1 (local rank 0) on b failed with exit code 1";
  r.exit_code = 1;
  r.report_json = R"({"host":"b","failures":[{"rank":1,"exit_code":1,"stderr_tail":[)"
                  R"("Traceback (most recent call last):","ImportError: nope"]}],)"
                  R"("before_progress":true})";
  for (int attempt = 0; attempt < 3; ++attempt) {
    INFO("attempt " << attempt);
    FailAttempt(e, attempt, r);
    if (attempt < 2) {
      CHECK(e.Job()["phase"] == "gathering");
      CHECK(e.Job()["crash_loop"]["attempts"] == attempt + 1);
    }
  }
  auto job = e.Job();
  CHECK(job["phase"] == "failed");
  CHECK(job["restarts_used"] == 2);  // restarts were left: the loop ended it
  CHECK(job["outcome"]["exit_code"] == crun::report::kExitDoNotRequeue);
  CHECK(job["outcome"]["reason"].get<std::string>().rfind(
            "crash loop: rank 1 (local rank 0) on b failed with exit code 1 in 3 attempts before "
            "any step: ImportError: nope",
            0) == 0);
}

TEST_CASE("etcd's decider ends a job failing the same way after progress (--max-repeated-failures)",
          "[decide]") {
  Etcd e;
  e.AddNode("a", "host-a", 1, 2, 2, /*max_restarts=*/10, 100, "torch",
            /*max_repeated_failures=*/2);
  e.AddNode("b", "host-b", 1, 2, 2, 10, 100, "torch", 2);
  Report r;
  r.what = "rank 1 (local rank 0) on b failed with exit code 1";
  r.exit_code = 1;
  r.report_json = R"({"host":"b","failures":[{"rank":1,"exit_code":1,"stderr_tail":[)"
                  R"("Traceback (most recent call last):","ValueError: bad batch"]}]})";
  for (int attempt = 0; attempt < 2; ++attempt) {
    INFO("attempt " << attempt);
    FailAttempt(e, attempt, r);
    if (attempt < 1) {
      CHECK(e.Job()["phase"] == "gathering");
      CHECK(e.Job()["crash_loop"]["repeats"] == 1);   // kept in the document, for a successor
      CHECK(e.Job()["crash_loop"]["attempts"] == 0);  // after progress: no crash loop
    }
  }
  auto job = e.Job();
  CHECK(job["phase"] == "failed");
  CHECK(job["restarts_used"] == 1);
  CHECK(job["outcome"]["exit_code"] == crun::report::kExitDoNotRequeue);
  CHECK(job["outcome"]["reason"].get<std::string>().rfind(
            "repeated failure: rank 1 (local rank 0) on b failed with exit code 1 in 2 attempts "
            "in a row, progress or not: ValueError: bad batch (--max-repeated-failures 2",
            0) == 0);
}

TEST_CASE("etcd job: what every agent watches (a/job) changes only when they must act") {
  Etcd e;
  for (const char* n : {"a", "b", "c"}) e.AddNode(n, std::string("host-") + n, 1, 3, 3);
  e.JoinNode("a");
  e.Step(Ms(0));
  // Nothing of who joined or when: it stays the same while the round gathers, so that a join
  // wakes the decider only, not every agent.
  CHECK(e.Public()["phase"] == "gathering");
  CHECK(e.Public()["joined"].empty());
  CHECK(e.Public()["join_deadline_ms"].is_null());
  const auto published = e.kv.at(e.keys.job()).mod_revision;
  e.JoinNode("b");
  auto d = e.Step(Ms(5));
  CHECK(d.write);  // the state took b's join...
  CHECK(e.Job()["joined"].size() == 2);
  CHECK(e.kv.at(e.keys.job()).mod_revision == published);  // ...and a/job did not change
  e.JoinNode("c");
  e.Step(Ms(10));
  CHECK(e.kv.at(e.keys.job()).mod_revision > published);
  CHECK(e.Public()["phase"] == "running");
  CHECK(e.Public()["members"].empty());  // each node reads its own place: ranks/<id>
  CHECK(e.Job()["members"].size() == 3);
  CHECK(e.Public()["world_size"] == 3);
  // Successes: the state counts them, a/job waits for the outcome.
  const auto running = e.kv.at(e.keys.job()).mod_revision;
  e.Put(e.keys.report(e.Gathering(), "a"), R"({"success":true})");
  e.Step(Ms(20));
  CHECK(e.kv.at(e.keys.job()).mod_revision == running);
  e.Put(e.keys.report(e.Gathering(), "b"), R"({"success":true})");
  e.Put(e.keys.report(e.Gathering(), "c"), R"({"success":true})");
  e.Step(Ms(30));
  CHECK(e.Public()["outcome"]["success"] == true);
}

TEST_CASE("etcd job: a node whose lease ended is lost, the others re-form without a restart") {
  Etcd e;
  e.AddNode("a", "host-a", 1, 1, 3);
  e.AddNode("b", "host-b", 1, 1, 3);
  e.AddNode("c", "host-c", 1, 1, 3);
  for (const char* n : {"a", "b", "c"}) e.JoinNode(n);
  e.Step(Ms(0));
  REQUIRE(e.Job()["members"].size() == 3);
  e.Put(e.keys.decider(), "a", 100);
  e.Delete(e.keys.node("a"));         // etcd let a's lease run out (the decider's own, here)
  e.Delete(e.keys.decider());         // bound to it
  e.Put(e.keys.decider(), "b", 101);  // b won the race to stand
  CHECK(crun::etcd::Decider(e.keys, e.kv) == "b");
  e.Step(Ms(100));
  auto job = e.Job();
  CHECK(job["phase"] == "gathering");
  CHECK(job["restarts_used"] == 0);
  CHECK(job["lost"] == nlohmann::json::array({"a"}));
  CHECK(job["stop"]["reason"].get<std::string>().find("node host-a (a) was lost: its etcd "
                                                      "lease ended") != std::string::npos);
  // For the goodput ledger: the fault was a heartbeat_timeout before the lease ran out.
  CHECK(job["stop"]["kind"] == "node lost");
  const auto lost_at = std::chrono::duration_cast<Ms>((kWall0 + Ms(100)).time_since_epoch());
  CHECK(job["stop"]["fault_ms"].get<std::int64_t>() ==
        (lost_at - crun::rdzv::Settings{}.heartbeat_timeout).count());
  CHECK(crun::etcd::DecodeJob(e.kv.at(e.keys.job()).value, kT0, kWall0)->stop_kind == "node lost");
  e.JoinNode("b");
  e.JoinNode("c");
  auto d = e.Step(Ms(110));
  CHECK(e.Job()["phase"] == "gathering");  // 2 of max 3: the last call runs
  REQUIRE(d.wake_at.has_value());
  e.Step(Ms(110) + std::chrono::duration_cast<Ms>(*d.wake_at - (kT0 + Ms(110))) + Ms(1));
  job = e.Job();
  CHECK(job["phase"] == "running");
  CHECK(job["members"].size() == 2);
  CHECK(job["members"][0]["id"] == "b");  // the new store host: group rank 0
}

TEST_CASE("etcd job: every member's success ends the job") {
  Etcd e;
  e.FormTwo();
  e.Succeed("a");
  e.Step(Ms(1));
  CHECK(e.Job()["phase"] == "running");
  e.Succeed("b");
  e.Step(Ms(2));
  CHECK(e.Job()["phase"] == "succeeded");
  CHECK(e.Job()["outcome"]["success"] == true);
  CHECK(e.Job()["outcome"]["exit_code"] == 0);
}

TEST_CASE("etcd job: a join with other settings is refused, bound to that agent's lease") {
  Etcd e;
  e.AddNode("a", "host-a", 1, 2, 2);
  e.AddNode("b", "host-b", 1, 2, 3, 0, /*lease=*/777);
  e.JoinNode("a");
  e.JoinNode("b");
  e.Step(Ms(0));
  const auto& refusal = e.kv.at(e.keys.refusal("b"));
  CHECK(refusal.value.find("--nnodes differs: this job uses 2:2, the joining agent 2:3") !=
        std::string::npos);
  CHECK(refusal.lease == 777);
  CHECK(e.Job()["joined"].size() == 1);
  CHECK_FALSE(e.Step(Ms(1)).write);  // refused once
}

TEST_CASE("etcd job: a finished job whose agents all left makes way for a new one") {
  Etcd e;
  e.OneSucceeded();
  e.Step(Ms(1));
  REQUIRE(e.Job()["phase"] == "succeeded");
  // An agent still there: a join is refused ("already finished").
  e.AddNode("b", "host-b", 1, 1, 1);
  e.JoinNode("b");
  e.Step(Ms(2));
  CHECK(e.kv.at(e.keys.refusal("b")).value == "the job has already finished");
  e.Delete(e.keys.node("a"));
  e.Delete(e.keys.node("b"));
  e.Delete(e.keys.refusal("b"));
  // Everyone left; a new agent comes: job 2, its gathering new.
  e.AddNode("c", "host-c", 1, 1, 1);
  e.Step(Ms(3));
  auto job = e.Job();
  CHECK(job["job"] == 2);
  CHECK(job["phase"] == "gathering");
  CHECK(job["restarts_used"] == 0);
  CHECK(!job.contains("outcome"));
  e.JoinNode("c");
  e.Step(Ms(4));
  CHECK(e.Job()["phase"] == "running");
}

TEST_CASE("etcd job: a layout written by another version is refused, naming both") {
  Etcd e;
  e.Put(e.keys.layout(), "crun-etcd-rendezvous/9");
  e.AddNode("a", "host-a", 1, 1, 1);
  auto d = Decide(e.keys, e.kv, kT0, kWall0);
  CHECK_FALSE(d.error.ok());
  CHECK(d.error.message().find("'crun-etcd-rendezvous/9', this crun writes "
                               "'crun-etcd-rendezvous/3'") != std::string::npos);
}

TEST_CASE("etcd job: deadlines survive another host's clocks, a corrupt document is an error") {
  crun::etcd::JobDoc doc;
  doc.state.settings.min_nodes = 1;
  doc.state.settings.max_nodes = 2;
  doc.state.join_deadline = kT0 + Ms(5'000);
  doc.gathering = 4;
  const auto text = crun::etcd::EncodeJob(doc, kT0, kWall0);
  // Another host: its steady clock elsewhere, its wall clock 1 s later (1 s has passed).
  const auto other = crun::rdzv::TimePoint(std::chrono::hours(7));
  auto back = crun::etcd::DecodeJob(text, other, kWall0 + Ms(1'000));
  REQUIRE(back.ok());
  CHECK(back->gathering == 4);
  REQUIRE(back->state.join_deadline.has_value());
  CHECK(*back->state.join_deadline - other == Ms(4'000));
  auto bad = crun::etcd::DecodeJob(R"({"job":1})", kT0, kWall0);
  CHECK_FALSE(bad.ok());
  CHECK(bad.status().message().find("job document") != std::string::npos);
}

TEST_CASE("etcd job: a node that failed its health check is folded in, named and kept") {
  Etcd e;
  e.AddNode("a", "host-a", 1, 1, 2);
  e.JoinNode("a");
  // c never joined: its key outlives it (no lease), and a torn one is skipped, not fatal.
  e.Put(e.keys.unhealthy("c"),
        crun::etcd::EncodeUnhealthy({"c", "host-c", "disk: /logs has 1 MiB free"}));
  e.Put(e.keys.unhealthy("d"), "{not json");
  e.Step(Ms(0));
  auto job = e.Job();
  CHECK(job["unhealthy_reports"] == 1);
  REQUIRE(job["unhealthy"].size() == 1);
  CHECK(job["unhealthy"][0]["node_id"] == "c");
  CHECK(job["unhealthy"][0]["host"] == "host-c");
  CHECK(job["unhealthy"][0]["reason"] == "disk: /logs has 1 MiB free");
  CHECK(e.kv.count(e.keys.unhealthy("c")) == 0);  // folded once
  CHECK(e.kv.count(e.keys.unhealthy("d")) == 0);
  // The round goes on without it (last call at 1 of 1:2), and the next decider still knows.
  e.Step(Ms(2'000));
  job = e.Job();
  CHECK(job["phase"] == "running");
  CHECK(job["unhealthy_reports"] == 1);
  auto decoded = crun::etcd::DecodeJob(e.kv.at(e.keys.state()).value, {}, {});
  REQUIRE(decoded.ok());
  REQUIRE(decoded->state.unhealthy.size() == 1);
  CHECK(decoded->state.unhealthy[0].reason == "disk: /logs has 1 MiB free");
}

namespace {

using crun::etcd::FigureJudge;
using crun::etcd::NodeFigures;
using Us = std::chrono::microseconds;

// A running round of n-a (host-a, ranks 0 and 1) and n-b (host-b, ranks 2 and 3).
crun::etcd::JobDoc RunningRound(Etcd& e) {
  e.AddNode("n-a", "host-a", 2, 2, 2, 1);
  e.AddNode("n-b", "host-b", 2, 2, 2, 1);
  e.Put(e.keys.decider(), "n-a", 100);
  e.JoinNode("n-a");
  e.JoinNode("n-b");
  e.Step(Ms(0));
  // The decider's document: with the members, which a/job leaves out.
  auto doc = crun::etcd::DecodeJob(e.kv.at(e.keys.state()).value, kT0, kWall0);
  REQUIRE(doc.ok());
  REQUIRE(doc->state.phase == crun::rdzv::Phase::kRunning);
  CHECK(doc->judges_stragglers);
  return *doc;
}

// Node `first_rank / 2`'s put of window `w`: its two ranks at `us` each.
NodeFigures WindowPut(int round, int first_rank, std::int64_t w, Us us) {
  return NodeFigures{round, {{first_rank, w, us}, {first_rank + 1, w, us}}};
}

}  // namespace

TEST_CASE("etcd job: slow ranks are judged job-wide from every node's figures") {
  Etcd e;
  const auto doc = RunningRound(e);
  const int round = doc.state.round;
  FigureJudge judge({});
  judge.Follow(doc);
  // Ranks 2 and 3 (n-b, equal among themselves) take 2.5 times as long: named in window 4.
  for (std::int64_t w = 0; w < 5; ++w) {
    CHECK_FALSE(judge.Fold("n-a", WindowPut(round, 0, w, Us(20'000))));
    CHECK(judge.Fold("n-b", WindowPut(round, 2, w, Us(50'000))) == (w == 4));
  }
  const auto& v = judge.verdicts();
  CHECK(v.round == round);
  REQUIRE(v.named.size() == 2);
  for (const auto& x : v.named) {
    CHECK(x.host == "host-b");
    CHECK(x.change.ratio == Approx(2.5));
    CHECK(x.change.window == 4);
  }
  CHECK(v.cleared.empty());
  // The verdicts, written to a/stragglers, are what `crun status` shows on each node.
  e.Put(crun::etcd::StragglersKey(e.keys), crun::etcd::EncodeVerdicts(v));
  auto status = crun::etcd::StatusOf(e.keys, "job1", e.kv, kT0, kWall0);
  REQUIRE(status.ok());
  for (const auto& n : status->nodes) {
    INFO(n.node_id);
    CHECK(n.stragglers.size() == (n.node_id == "n-b" ? 2u : 0u));
  }
  // Each node says each verdict once; a clearing once; another round's verdicts nothing.
  std::set<int> said;
  const auto read = crun::etcd::DecodeVerdicts(crun::etcd::EncodeVerdicts(v));
  REQUIRE(read.ok());
  CHECK(crun::etcd::NewVerdicts(*read, round, said).size() == 2);
  CHECK(crun::etcd::NewVerdicts(*read, round, said).empty());
  CHECK(crun::etcd::NewVerdicts(*read, round + 1, said).empty());
  auto cleared = *read;
  cleared.cleared.push_back(cleared.named.back());
  cleared.cleared.back().change.named = false;
  cleared.named.pop_back();
  const auto told = crun::etcd::NewVerdicts(cleared, round, said);
  REQUIRE(told.size() == 1);
  CHECK_FALSE(told.front().change.named);
  CHECK(said.size() == 1);
  // Back at speed for 5 windows: cleared, and no longer in status.
  for (std::int64_t w = 5; w < 10; ++w) {
    judge.Fold("n-a", WindowPut(round, 0, w, Us(20'000)));
    judge.Fold("n-b", WindowPut(round, 2, w, Us(20'000)));
  }
  CHECK(judge.verdicts().named.empty());
  CHECK(judge.verdicts().cleared.size() == 2);
  e.Put(crun::etcd::StragglersKey(e.keys), crun::etcd::EncodeVerdicts(judge.verdicts()));
  status = crun::etcd::StatusOf(e.keys, "job1", e.kv, kT0, kWall0);
  REQUIRE(status.ok());
  for (const auto& n : status->nodes) CHECK(n.stragglers.empty());
}

TEST_CASE("etcd job: a node's figures count for its own ranks of the round followed only") {
  Etcd e;
  auto doc = RunningRound(e);
  const int round = doc.state.round;
  FigureJudge judge({});
  // Nothing is judged before a round is followed.
  CHECK_FALSE(judge.Fold("n-a", WindowPut(round, 0, 0, Us(20'000))));
  judge.Follow(doc);
  for (std::int64_t w = 0; w < 8; ++w) {
    // n-a speaks for every rank, n-b's as slow ones; figures of another round; ranks that
    // are no rank of the round. Were any taken, ranks 2 and 3 would be named.
    NodeFigures all{round, {}};
    for (int r = 0; r < 4; ++r) all.figures.push_back({r, w, Us(r < 2 ? 20'000 : 50'000)});
    CHECK_FALSE(judge.Fold("n-a", all));
    CHECK_FALSE(judge.Fold("n-b", WindowPut(round + 1, 2, w, Us(50'000))));
    CHECK_FALSE(judge.Fold("n-b", WindowPut(round, 4, w, Us(50'000))));
    CHECK_FALSE(judge.Fold("n-b", WindowPut(round, -2, w, Us(50'000))));
  }
  CHECK(judge.verdicts().named.empty());
  // A new round starts over.
  doc.state.round = round + 1;
  judge.Follow(doc);
  CHECK(judge.verdicts().round == round + 1);
  // Unreadable values are refused naming whose they are.
  CHECK_THAT(
      crun::etcd::DecodeFigures("n-b", "{\"round\": 1, \"figures\": [[1, 2]]}").status().message(),
      Catch::Contains("figures of 'n-b'"));
  CHECK_FALSE(crun::etcd::DecodeVerdicts("[]").ok());
  const auto back =
      crun::etcd::DecodeFigures("n-a", crun::etcd::EncodeFigures(WindowPut(3, 0, 7, Us(5))));
  REQUIRE(back.ok());
  CHECK(back->round == 3);
  REQUIRE(back->figures.size() == 2);
  CHECK(back->figures[1].rank == 1);
  CHECK(back->figures[1].window == 7);
  CHECK(back->figures[1].compute == Us(5));
}

TEST_CASE("etcd job: keys do not grow with rounds: the last rounds kept, old stores deleted") {
  Etcd e;
  e.AddNode("a", "host-a", 1, 2, 2, /*max_restarts=*/1000);
  e.AddNode("b", "host-b", 1, 2, 2, 1000);
  std::size_t keys_after_two = 0;
  for (int round = 0; round < 3 * crun::etcd::kRoundsKept; ++round) {
    e.JoinNode("a");
    e.JoinNode("b");
    e.Step(Ms(10'000 * round));  // apart enough not to be a storm of rounds
    REQUIRE(e.Job()["round"] == round);
    // Its group rank 0 publishes the round's store, bound to its lease.
    e.Put(e.keys.store(round), "10.0.0.1:" + std::to_string(30000 + round), 100);
    if (round == 2) keys_after_two = e.kv.size();
    if (round >= 2) CHECK(e.kv.size() <= keys_after_two + crun::etcd::kRoundsKept);
    e.Put(e.keys.report(e.Gathering(), "b"), FailedAnotherWay(round));
    e.Step(Ms(10'000 * round + 5));
    REQUIRE(e.Job()["phase"] == "gathering");
  }
  std::vector<std::string> rounds, stores;
  for (const auto& [key, kv] : e.kv) {
    if (key.starts_with(e.keys.rounds())) rounds.push_back(key);
    if (key.starts_with(e.keys.stores())) stores.push_back(key);
  }
  const int last = 3 * crun::etcd::kRoundsKept - 1;
  REQUIRE(rounds.size() == static_cast<std::size_t>(crun::etcd::kRoundsKept));
  CHECK(rounds.front() == e.keys.round(last - crun::etcd::kRoundsKept + 1));
  CHECK(rounds.back() == e.keys.round(last));
  CHECK(stores == std::vector<std::string>{e.keys.store(last)});  // the last round's, still
}

TEST_CASE("etcd job: an ended job binds every key of its run to one retention lease") {
  Etcd e;
  e.FormTwo();
  e.Put(e.keys.store(0), "10.0.0.1:30000", 100);
  e.Succeed("a");
  e.Step(Ms(1));
  // Running still: nothing bound but what agents bound to their own leases.
  for (const auto& [key, kv] : e.kv) {
    if (kv.lease != 0) CHECK(kv.lease == 100);  // the agents' own (nodes, joins, the store)
  }
  e.Succeed("b");
  const crun::etcd::Retention retention{std::chrono::seconds(60), 0};
  // The job ends: the first decision asks for the lease and writes nothing.
  auto ask = Decide(e.keys, e.kv, kT0 + Ms(2), kWall0 + Ms(2), retention);
  REQUIRE(ask.needs_lease);
  CHECK_FALSE(ask.write);
  CHECK(ask.ops.empty());
  // Given one, it binds the state, a/job, the layout, the history and the reports to it.
  auto d = Decide(e.keys, e.kv, kT0 + Ms(2), kWall0 + Ms(2), {std::chrono::seconds(60), 555});
  REQUIRE(d.write);
  CHECK(d.job_lease == 555);
  CHECK(nlohmann::json::parse(d.job_json)["phase"] == "succeeded");
  CHECK(nlohmann::json::parse(d.job_json)["retention_lease"] == 555);
  std::set<std::string> bound;
  for (const auto& op : d.ops) {
    if (op.kind == Op::Kind::kPut) {
      CHECK(op.lease == 555);
      bound.insert(op.key);
    }
  }
  CHECK(bound == std::set<std::string>{e.keys.job(), e.keys.layout(), e.keys.round(0)});
  // Every report of the last gathering has been read: deleted at once, not bound one by one.
  CHECK(std::any_of(d.ops.begin(), d.ops.end(), [&](const Op& op) {
    return op.kind == Op::Kind::kDeletePrefix && op.key == e.keys.reports();
  }));
  // Applied, later passes keep the same lease without asking, and a key put unbound since
  // (a late write) is bound at the next one.
  e.Apply(d);
  CHECK(e.kv.count(e.keys.report(0, "a")) == 0);
  auto quiet = Decide(e.keys, e.kv, kT0 + Ms(3), kWall0 + Ms(3), retention);
  CHECK_FALSE(quiet.needs_lease);
  CHECK_FALSE(quiet.write);
  e.Put(e.keys.last_failure(), "late");
  auto late = Decide(e.keys, e.kv, kT0 + Ms(4), kWall0 + Ms(4), retention);
  REQUIRE(late.write);
  CHECK(late.job_lease == 555);
  REQUIRE(late.ops.size() == 1);
  CHECK(late.ops[0].key == e.keys.last_failure());
  CHECK(late.ops[0].lease == 555);
  // Retention 0: kept until removed by hand; nothing is bound.
  Etcd kept;
  kept.OneSucceeded();
  auto off = Decide(kept.keys, kept.kv, kT0 + Ms(1), kWall0 + Ms(1), {std::chrono::seconds(0), 0});
  CHECK_FALSE(off.needs_lease);
  CHECK(off.job_lease == 0);
  for (const auto& op : off.ops) CHECK(op.lease == 0);
}

TEST_CASE("etcd job: a new job on the run id unbinds what it keeps from the old one's lease") {
  Etcd e;
  e.OneSucceeded();
  REQUIRE(
      e.Apply(Decide(e.keys, e.kv, kT0 + Ms(1), kWall0 + Ms(1), {std::chrono::seconds(60), 555}))
          .write);
  REQUIRE(e.kv.at(e.keys.layout()).lease == 555);
  e.Delete(e.keys.node("a"));
  e.AddNode("c", "host-c", 1, 1, 1);
  auto renew = Decide(e.keys, e.kv, kT0 + Ms(2), kWall0 + Ms(2), {std::chrono::seconds(60), 0});
  REQUIRE(renew.write);
  CHECK_FALSE(renew.needs_lease);
  CHECK(renew.job_lease == 0);
  CHECK(nlohmann::json::parse(renew.job_json)["job"] == 2);
  CHECK_FALSE(nlohmann::json::parse(renew.job_json).contains("retention_lease"));
  std::set<std::string> unbound;
  for (const auto& op : renew.ops) {
    if (op.kind == Op::Kind::kPut && op.lease == 0) unbound.insert(op.key);
  }
  CHECK(unbound.count(e.keys.layout()) == 1);
  CHECK(unbound.count(e.keys.job()) == 1);
}

TEST_CASE("etcd job: tidying never makes a transaction larger than etcd takes") {
  // A run that an older crun left with 300 rounds and stores, then 300 nodes that end it.
  Etcd e;
  for (int i = 0; i < 300; ++i) {
    e.Put(e.keys.round(i), "{}");
    e.Put(e.keys.store(i), "10.0.0.1:1", 100);
  }
  for (int i = 0; i < 300; ++i) {
    const std::string id = "n" + std::to_string(i);
    e.AddNode(id, "host-" + id, 1, 300, 300, /*max_restarts=*/1000);
    e.JoinNode(id);
  }
  std::size_t before = e.kv.size();
  e.Step(Ms(0));  // Apply requires every decision to fit a transaction
  REQUIRE(e.Job()["phase"] == "running");
  // Some old keys went, within the limit (and each node's ranks/ record came).
  CHECK(e.kv.size() < before + 4 + 300);
  // Each later round takes kMaxTidied more of them until only the last ones are left.
  for (int round = 1; round < 30; ++round) {
    e.Put(e.keys.report(e.Gathering(), "n0"), FailedAnotherWay(round));
    e.Step(Ms(10'000 * round));
    for (int i = 0; i < 300; ++i) e.JoinNode("n" + std::to_string(i));
    e.Step(Ms(10'000 * round + 5));
  }
  std::size_t rounds = 0, stores = 0;
  for (const auto& [key, kv] : e.kv) {
    rounds += key.starts_with(e.keys.rounds());
    stores += key.starts_with(e.keys.stores());
  }
  CHECK(rounds == static_cast<std::size_t>(crun::etcd::kRoundsKept));
  CHECK(stores == 0);  // nobody published this run's stores
  // The end: 300 reports, bound or deleted within one transaction, the rest on later passes.
  for (int i = 0; i < 300; ++i) {
    e.Put(e.keys.report(e.Gathering(), "n" + std::to_string(i)),
          crun::etcd::EncodeReport(Report{true, "", 0, ""}));
  }
  for (int i = 0; i < 300; ++i) e.Put(e.keys.refusal("x" + std::to_string(i)), "late, unbound");
  const crun::etcd::Retention retention{std::chrono::seconds(60), 777};
  auto end = e.Apply(Decide(e.keys, e.kv, kT0 + Ms(400'000), kWall0 + Ms(400'000), retention));
  REQUIRE(nlohmann::json::parse(end.job_json)["phase"] == "succeeded");
  REQUIRE(end.wake_at.has_value());  // more to bind: the next pass comes at once
  for (int pass = 0; pass < 40; ++pass) {
    e.Apply(Decide(e.keys, e.kv, kT0 + Ms(400'001 + pass), kWall0 + Ms(400'001 + pass), retention));
  }
  for (const auto& [key, kv] : e.kv) {
    // A node's own keys go with its lease.
    if (!key.starts_with(e.keys.nodes()) && !key.starts_with(e.keys.joins()) &&
        !key.starts_with(e.keys.ranks())) {
      CHECK(kv.lease == 777);
    }
  }
}

TEST_CASE("etcd job: each node's place is its own key, a/job does not grow with the nodes") {
  // 3 nodes, then 300 (more than one transaction of ranks/ records), 2 workers each, and 7
  // spares (taken after the round formed): the same a/job, and each node's record names its
  // own place.
  std::size_t public_bytes_of_3 = 0;
  for (const int n : {3, 300}) {
    INFO(n << " nodes");
    Etcd e;
    auto id = [](int i) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "n%04d", i);
      return std::string(buf);
    };
    for (int i = 0; i < n + 7; ++i) {
      e.AddNode(id(i), "host-" + id(i), 2, n, n, 1, 1000 + i);
      e.JoinNode(id(i));
    }
    const auto d = e.Step(Ms(0));
    REQUIRE(e.Public()["phase"] == "running");
    CHECK(d.rank_ops.size() == static_cast<std::size_t>(n + 7));
    const std::string token = e.Public().at("ranks_token").get<std::string>();
    CHECK_FALSE(token.empty());
    CHECK(e.Job().at("ranks_token") == token);
    std::set<int> ranks;
    int spares = 0;
    for (int i = 0; i < n + 7; ++i) {
      const auto& kv = e.kv.at(e.keys.rank(id(i)));
      CHECK(kv.lease == 1000 + i);  // gone with its node
      auto r = crun::etcd::DecodeRank(id(i), kv.value);
      REQUIRE(r.ok());
      CHECK(r->token == token);
      CHECK(r->round == 0);
      CHECK(r->group_world_size == n);
      if (r->spare) {
        ++spares;
        continue;
      }
      CHECK(r->base_rank == 2 * r->group_rank);
      ranks.insert(r->group_rank);
    }
    CHECK(spares == 7);
    CHECK(ranks.size() == static_cast<std::size_t>(n));
    CHECK(*ranks.rbegin() == n - 1);
    CHECK(e.Public()["members"].empty());
    const auto bytes = e.kv.at(e.keys.job()).value.size();
    if (n == 3) public_bytes_of_3 = bytes;
    // O(spares): the members are in the state only; 300 nodes add digits to sizes alone.
    CHECK(bytes <= public_bytes_of_3 + 8);
    // Records of an earlier decision are not this one's: the next round has a new token.
    e.Put(e.keys.report(e.Gathering(), id(0)), FailureReport("rank 0 failed", 1));
    e.Step(Ms(10));
    for (int i = 0; i < n + 7; ++i) e.JoinNode(id(i));
    e.Step(Ms(20));
    REQUIRE(e.Public()["phase"] == "running");
    CHECK(e.Public()["ranks_token"] != token);
    auto again = crun::etcd::DecodeRank(id(1), e.kv.at(e.keys.rank(id(1))).value);
    REQUIRE(again.ok());
    CHECK(again->token == e.Public()["ranks_token"]);
    CHECK(again->round == 1);
  }
}

TEST_CASE("etcd job: a node record keeps every setting of the one list, older ones default") {
  NodeRecord r;
  r.node.node_id = "n1";
  r.node.host = "h1";
  r.node.nproc = 2;
  int i = 0;
  for (const auto& f : crun::rdzv::SettingFields()) {
    ++i;
    if (f.kind == crun::rdzv::SettingField::Kind::kContracts) {
      r.settings.contracts = crun::ParseContracts("jax,mpi").value();
    } else {
      f.set(r.settings, f.get(r.settings) + 13 * i);
    }
  }
  const auto back = crun::etcd::DecodeNode("n1", crun::etcd::EncodeNode(r));
  REQUIRE(back.ok());
  CHECK(back->settings == r.settings);
  // A record written before the optional fields: each keeps its default; a required one
  // missing is refused.
  auto j = nlohmann::json::parse(crun::etcd::EncodeNode(r));
  for (const auto& f : crun::rdzv::SettingFields()) {
    if (f.json_optional) j["settings"].erase(crun::rdzv::WireName(f));
  }
  const auto older = crun::etcd::DecodeNode("n1", j.dump());
  REQUIRE(older.ok());
  const crun::rdzv::Settings defaults;
  for (const auto& f : crun::rdzv::SettingFields()) {
    INFO(f.name);
    CHECK(f.get(older->settings) == (f.json_optional ? f.get(defaults) : f.get(r.settings)));
  }
  j["settings"].erase("max_restarts");
  CHECK_FALSE(crun::etcd::DecodeNode("n1", j.dump()).ok());
}
