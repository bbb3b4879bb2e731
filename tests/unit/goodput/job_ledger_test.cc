// The job's goodput ledger combined from its nodes' (rendezvous/goodput/job_ledger.h), the
// summary line, and the JSON that --goodput-file writes and `crun timeline` reads back.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "rendezvous/goodput/job_ledger.h"
#include "rendezvous/goodput/ledger_json.h"

namespace {

using crun::goodput::Category;
using crun::goodput::Combine;
using crun::goodput::Incident;
using crun::goodput::JobLedger;
using crun::goodput::Ms;
using crun::goodput::NodeLedger;
using crun::goodput::Segment;

constexpr Category T = Category::kTraining, R = Category::kRedone, S = Category::kStarting,
                   D = Category::kDetecting, X = Category::kRestarting, L = Category::kReloading,
                   W = Category::kWaiting;

NodeLedger Node(std::string id, std::vector<Segment> segments) {
  NodeLedger n;
  n.node = std::move(id);
  n.launched = segments.front().begin;
  n.until = segments.back().end;
  for (const auto& s : segments) crun::goodput::At(n.totals, s.category) += s.end - s.begin;
  n.segments = std::move(segments);
  n.steps_known = n.progress_known = n.finished = true;
  return n;
}

TEST_CASE("goodput job: each instant goes to the node that holds the job back most", "[goodput]") {
  struct Row {
    const char* name;
    std::vector<NodeLedger> nodes;
    std::vector<Segment> job;
  };
  const Row rows[] = {
      {"all training: training", {Node("a", {{T, 0, 10}}), Node("b", {{T, 0, 10}})}, {{T, 0, 10}}},
      {"one node's incident is the job's",
       {Node("a", {{T, 0, 10}}), Node("b", {{T, 0, 4}, {D, 4, 6}, {X, 6, 8}, {T, 8, 10}})},
       {{T, 0, 4}, {D, 4, 6}, {X, 6, 8}, {T, 8, 10}}},
      {"detecting before restarting before waiting before starting",
       {Node("a", {{X, 0, 4}, {W, 4, 8}}), Node("b", {{D, 0, 2}, {S, 2, 8}})},
       {{D, 0, 2}, {X, 2, 4}, {W, 4, 8}}},
      {"reloading before redone before training",
       {Node("a", {{L, 0, 3}, {R, 3, 6}, {T, 6, 9}}), Node("b", {{R, 0, 5}, {T, 5, 9}})},
       {{L, 0, 3}, {R, 3, 6}, {T, 6, 9}}},
      {"a spare's wait holds nothing back",
       {Node("a", {{T, 0, 10}}), Node("c", {{S, 0, 1}, {Segment{W, 1, 10, false}}})},
       {{S, 0, 1}, {T, 1, 10}}},
      {"a lost node holds nothing back after its last report",
       {Node("a", {{T, 0, 4}, {D, 4, 7}, {X, 7, 10}}), Node("b", {{T, 0, 5}})},
       {{T, 0, 4}, {D, 4, 7}, {X, 7, 10}}},
      {"no member accounts for an instant: waiting; a replacement starting, restarting",
       {Node("a", {{T, 0, 3}}), Node("b", {{S, 6, 8}, {T, 8, 10}})},
       {{T, 0, 3}, {W, 3, 6}, {X, 6, 8}, {T, 8, 10}}},
      {"clocks 1 ms apart move a boundary by 1 ms",
       {Node("a", {{S, 0, 5}, {T, 5, 10}}), Node("b", {{S, 1, 6}, {T, 6, 11}})},
       {{S, 0, 6}, {T, 6, 11}}},
  };
  for (const Row& r : rows) {
    INFO(r.name);
    const JobLedger job = Combine(r.nodes);
    CHECK(job.segments == r.job);
    CHECK(crun::goodput::Sum(job.totals) == job.until - job.begin);
  }
}

TEST_CASE("goodput job: a spare that only waited does not make the figures unknown", "[goodput]") {
  NodeLedger spare = Node("s", {Segment{W, 0, 10, false}});
  spare.steps_known = spare.progress_known = false;
  const JobLedger job = Combine({Node("a", {{T, 0, 10}}), spare});
  CHECK(job.progress_known);
  CHECK(job.steps_known);
  NodeLedger quiet = Node("q", {{S, 0, 10}});
  quiet.steps_known = quiet.progress_known = false;
  CHECK_FALSE(Combine({quiet}).progress_known);
}

TEST_CASE("goodput job: overlapping incidents of nodes are one, named by the earliest fault",
          "[goodput]") {
  NodeLedger a = Node("a", {{T, 0, 100},
                            {D, 100, 130},
                            {X, 130, 150},
                            {L, 150, 170},
                            {R, 170, 200},
                            {T, 200, 400},
                            {D, 400, 410},
                            {X, 410, 420},
                            {T, 420, 500}});
  a.incidents.push_back({100, 130, "node lost", "node b lost", 10, 7, 200, {}});
  a.incidents.push_back({400, 410, "crash", "local rank 0 exited with code 1", 30, 29, 420, {}});
  NodeLedger b =
      Node("b", {{T, 0, 100}, {S, 140, 160}, {L, 160, 175}, {R, 175, 205}, {T, 205, 500}});
  b.incidents.push_back({90, 140, "peer", "a peer failed", 9, 6, 205, {}});
  const JobLedger job = Combine({a, b});
  REQUIRE(job.incidents.size() == 2);
  const Incident& first = job.incidents[0];
  CHECK(first.kind == "peer");  // the earliest fault
  CHECK(first.fault == 90);
  CHECK(first.step_at_failure == 10);
  CHECK(first.resumed_from == 6);
  CHECK(first.resumed == 205);
  std::map<std::string, Ms> cost;
  for (Category c : crun::goodput::kAllCategories) {
    const Ms ms = crun::goodput::At(first.cost, c);
    if (ms > 0) cost[std::string(NameOf(c))] = ms;
  }
  // From 90 to 205: a trains until 100 (not a cost), detects, restarts; b, the replacement,
  // starts (the job restarting), reloads and redoes.
  CHECK(cost == std::map<std::string, Ms>{{"detecting", 30},
                                          {"restarting", 20 + 10},
                                          {"reloading", 15},
                                          {"redone", 30}});
  CHECK(job.incidents[1].kind == "crash");
  CHECK(crun::goodput::Sum(job.incidents[1].cost) == 20);
}

TEST_CASE("goodput summary: the line at the end of a job", "[goodput]") {
  crun::goodput::Totals t{};
  auto s = [](Ms m, Ms sec) { return (m * 60 + sec) * 1000; };
  crun::goodput::At(t, T) = s(57, 40);
  crun::goodput::At(t, S) = s(0, 25);
  crun::goodput::At(t, D) = s(0, 9);
  crun::goodput::At(t, X) = s(0, 2);
  crun::goodput::At(t, L) = s(0, 6);
  crun::goodput::At(t, R) = s(0, 24);
  crun::goodput::At(t, W) = s(1, 11);
  CHECK(crun::goodput::Summary(t, 3, true, true) ==
        "goodput 96.2 % (57 m 40 s of 59 m 57 s training); starting 25 s; 3 incidents cost "
        "1 m 52 s: detecting 9 s, restarting 2 s, reloading 6 s, redone 24 s, waiting 1 m 11 s");
  CHECK(crun::goodput::Summary(t, 3, false, true)
            .ends_with("; redone: unknown, the workers report no steps"));
  CHECK(crun::goodput::Summary(t, 3, true, false)
            .starts_with("goodput unknown: the workers report no progress"));
  crun::goodput::Totals clean{};
  crun::goodput::At(clean, T) = 7000;
  crun::goodput::At(clean, S) = 1400;
  CHECK(crun::goodput::Summary(clean, 0, true, true) ==
        "goodput 83.3 % (7 s of 8.4 s training); starting 1.4 s");
  CHECK(crun::goodput::Spoken(2 * 3600 * 1000 + 5 * 60 * 1000) == "2 h 5 m");
}

TEST_CASE("goodput JSON: a node's ledger reads back as it was written", "[goodput]") {
  crun::goodput::Ledger l = crun::goodput::Ledger::Launched("node-1", "host-a", 1, 1000);
  l.Joining(1000);
  l.Assigned(1200, false, 100);
  l.WorkersRunning(1300);
  l.Progress(2300, 0, 1);
  l.Saved(2400, 1);
  l.Progress(3300, 0, 2);
  l.FailureKnown(3500, 3400, "hang", "no progress for \"10 s\"");
  l.Joining(3600);
  l.Assigned(3700, true, 0);
  l.Finished(4000);
  const NodeLedger n = l.Settled();
  const auto back = crun::goodput::NodeFromJson(nlohmann::json::parse(ToJson(n).dump()));
  REQUIRE(back.ok());
  CHECK(*back == n);
  const JobLedger job = Combine({n});
  const auto nodes = crun::goodput::NodesFromFile(FileJson(job).dump(2), "g.json");
  REQUIRE(nodes.ok());
  CHECK(Combine(*nodes).segments == job.segments);
  CHECK(Combine(*nodes).totals == job.totals);
  // The job's element alone (what etcd's decider hands every node), without its nodes.
  const auto back_job =
      crun::goodput::JobFromJson(nlohmann::json::parse(crun::goodput::JobJson(job).dump()));
  REQUIRE(back_job.ok());
  CHECK(back_job->begin == job.begin);
  CHECK(back_job->until == job.until);
  CHECK(back_job->totals == job.totals);
  CHECK(back_job->segments == job.segments);
  CHECK(back_job->incidents == job.incidents);
  CHECK(back_job->finished == job.finished);
  CHECK(back_job->nodes.empty());
  auto bad = nlohmann::json::parse(crun::goodput::JobJson(job).dump());
  bad["until_ms"] = job.until + 1;
  CHECK_THAT(crun::goodput::JobFromJson(bad).status().message(),
             Catch::Contains("the job: totals_ms add up to"));
}

TEST_CASE("goodput JSON: a file that is not a ledger is refused, naming what is wrong",
          "[goodput]") {
  struct Row {
    std::string text, error;
  };
  const Row rows[] = {
      {"{", "g.json is not JSON"},
      {"[]", "no \"nodes\" list"},
      {R"({"nodes": []})", "names no node"},
      {R"({"nodes": [{"node": "a"}]})", "not a node's ledger"},
      {R"({"nodes": [{"node": "a", "launched_ms": 0, "until_ms": 5, "totals_ms": {"train": 5}}]})",
       "unknown category \"train\""},
      {R"({"nodes": [{"node": "a", "launched_ms": 0, "until_ms": 5,
                      "totals_ms": {"training": 4}}]})",
       "node a: totals_ms add up to 4 ms, not until_ms - launched_ms = 5"},
      {R"({"nodes": [{"node": "a", "launched_ms": 0, "until_ms": 5,
                      "totals_ms": {"training": -5}}]})",
       "totals_ms.training is not a count of milliseconds"},
      {R"({"nodes": [{"node": "a", "launched_ms": 0, "until_ms": 5, "totals_ms": {"training": 5},
          "segments": [{"category": "training", "begin_ms": 0, "end_ms": 9}]}]})",
       "node a: a segment outside its ledger's time"},
  };
  for (const Row& r : rows) {
    INFO(r.text);
    const auto got = crun::goodput::NodesFromFile(r.text, "g.json");
    REQUIRE_FALSE(got.ok());
    CHECK_THAT(got.status().message(), Catch::Contains(r.error));
  }
}

}  // namespace
