#include "rendezvous/goodput/ledger_json.h"

#include <cmath>

namespace crun::goodput {
namespace {

using nlohmann::json;
using Ordered = nlohmann::ordered_json;

Ordered TotalsJson(const Totals& t) {
  Ordered out = Ordered::object();
  for (Category c : kAllCategories) out[std::string(NameOf(c))] = At(t, c);
  return out;
}

Ordered SecondsJson(const Totals& t) {
  Ordered out = Ordered::object();
  for (Category c : kAllCategories) {
    out[std::string(NameOf(c))] = std::round(static_cast<double>(At(t, c)) / 10.0) / 100.0;
  }
  return out;
}

Ordered SegmentsJson(const std::vector<Segment>& segments) {
  Ordered out = Ordered::array();
  for (const auto& s : segments) {
    Ordered j = {{"category", NameOf(s.category)}, {"begin_ms", s.begin}, {"end_ms", s.end}};
    if (!s.member) j["spare"] = true;
    out.push_back(std::move(j));
  }
  return out;
}

Ordered IncidentsJson(const std::vector<Incident>& incidents) {
  Ordered out = Ordered::array();
  for (const auto& i : incidents) {
    Ordered j = {{"fault_ms", i.fault},
                 {"known_ms", i.known},
                 {"kind", i.kind},
                 {"cause", i.cause}};
    if (i.step_at_failure) j["step_at_failure"] = *i.step_at_failure;
    if (i.resumed_from) j["resumed_from"] = *i.resumed_from;
    j["resumed_ms"] = i.resumed;
    j["cost_ms"] = TotalsJson(i.cost);
    out.push_back(std::move(j));
  }
  return out;
}

// What a reader of the file wants first: the ratio, the seconds, the summary line.
void Head(Ordered& j, const Totals& t, const std::string& summary) {
  j["goodput"] = std::round(Goodput(t) * 10000.0) / 10000.0;
  j["seconds"] = SecondsJson(t);
  j["summary"] = summary;
}

// What a node's ledger and the job's both say, after their heads.
void Body(Ordered& j, bool finished, bool steps_known, bool progress_known, const Totals& totals,
          const std::vector<Incident>& incidents, const std::vector<Segment>& segments) {
  j["finished"] = finished;
  j["steps_known"] = steps_known;
  j["progress_known"] = progress_known;
  j["totals_ms"] = TotalsJson(totals);
  j["incidents"] = IncidentsJson(incidents);
  j["segments"] = SegmentsJson(segments);
}

Status Bad(const std::string& what) {
  return Status(StatusCode::kInvalidArgument, "goodput ledger: " + what);
}

StatusOr<Totals> TotalsFrom(const json& j, const char* key) {
  Totals t{};
  if (!j.contains(key)) return t;
  const json& o = j.at(key);
  if (!o.is_object()) return Bad(std::string(key) + " is not an object");
  for (const auto& [name, value] : o.items()) {
    const auto c = CategoryNamed(name);
    if (!c) return Bad("unknown category \"" + name + "\" in " + key);
    if (!value.is_number_integer() || value.get<Ms>() < 0) {
      return Bad(std::string(key) + "." + name + " is not a count of milliseconds");
    }
    At(t, *c) = value.get<Ms>();
  }
  return t;
}

}  // namespace

Ordered ToJson(const NodeLedger& n) {
  Ordered j = {{"node", n.node}, {"host", n.host}};
  Head(j, n.totals, Summary(n));
  j["launched_ms"] = n.launched;
  j["until_ms"] = n.until;
  Body(j, n.finished, n.steps_known, n.progress_known, n.totals, n.incidents, n.segments);
  j["saves_ms"] = n.saves;
  Ordered steps = Ordered::array();
  for (const auto& p : n.steps) steps.push_back({p.at, p.step});
  j["steps"] = std::move(steps);
  return j;
}

namespace {

// A ledger's segments (within [from, until]) and incidents; `who` names it in an error.
Status BodyFrom(const json& j, const std::string& who, Ms from, Ms until,
                std::vector<Segment>& segments, std::vector<Incident>& incidents) {
  for (const auto& s : j.value("segments", json::array())) {
    const auto c = CategoryNamed(s.at("category").get<std::string>());
    if (!c) return Bad(who + ": unknown segment category " + s.at("category").dump());
    const Segment seg{*c, s.at("begin_ms").get<Ms>(), s.at("end_ms").get<Ms>(),
                      !s.value("spare", false)};
    if (seg.begin > seg.end || seg.begin < from || seg.end > until) {
      return Bad(who + ": a segment outside its ledger's time (" + s.dump() + ")");
    }
    segments.push_back(seg);
  }
  for (const auto& i : j.value("incidents", json::array())) {
    Incident x;
    x.fault = i.at("fault_ms").get<Ms>();
    x.known = i.at("known_ms").get<Ms>();
    x.kind = i.value("kind", "");
    x.cause = i.value("cause", "");
    if (i.contains("step_at_failure"))
      x.step_at_failure = i.at("step_at_failure").get<std::int64_t>();
    if (i.contains("resumed_from")) x.resumed_from = i.at("resumed_from").get<std::int64_t>();
    x.resumed = i.value("resumed_ms", Ms{0});
    auto cost = TotalsFrom(i, "cost_ms");
    if (!cost.ok()) return cost.status();
    x.cost = *cost;
    incidents.push_back(std::move(x));
  }
  if (segments.size() > kMaxSegments || incidents.size() > kMaxIncidents) {
    return Bad(who + ": more segments or incidents than a ledger keeps");
  }
  return Status::Ok();
}

// Totals that add up to the ledger's time, from `from` (its field `from_key`) to until_ms.
StatusOr<Totals> WholeTotals(const json& j, const std::string& who, Ms from, const char* from_key,
                             Ms until) {
  auto totals = TotalsFrom(j, "totals_ms");
  if (!totals.ok()) return totals.status();
  if (Sum(*totals) != until - from) {
    return Bad(who + ": totals_ms add up to " + std::to_string(Sum(*totals)) +
               " ms, not until_ms - " + from_key + " = " + std::to_string(until - from));
  }
  return totals;
}

}  // namespace

StatusOr<NodeLedger> NodeFromJson(const json& j) {
  try {
    NodeLedger n;
    n.node = j.at("node").get<std::string>();
    n.host = j.value("host", "");
    n.launched = j.at("launched_ms").get<Ms>();
    n.until = j.at("until_ms").get<Ms>();
    n.finished = j.value("finished", false);
    n.steps_known = j.value("steps_known", false);
    n.progress_known = j.value("progress_known", false);
    const std::string who = "node " + n.node;
    auto totals = WholeTotals(j, who, n.launched, "launched_ms", n.until);
    if (!totals.ok()) return totals.status();
    n.totals = *totals;
    if (auto s = BodyFrom(j, who, n.launched, n.until, n.segments, n.incidents); !s.ok()) return s;
    n.saves = j.value("saves_ms", std::vector<Ms>{});
    for (const auto& p : j.value("steps", json::array())) {
      n.steps.push_back({p.at(0).get<Ms>(), p.at(1).get<std::int64_t>()});
    }
    if (n.saves.size() > kMaxMarks || n.steps.size() > kMaxMarks) {
      return Bad(who + ": more marks than a ledger keeps");
    }
    return n;
  } catch (const json::exception& e) {
    return Bad(std::string("not a node's ledger: ") + e.what());
  }
}

StatusOr<NodeLedger> NodeFromText(const std::string& text, const std::string& node_id) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Bad((node_id.empty() ? std::string("a node") : "node " + node_id) +
               ": its ledger is not JSON");
  }
  auto n = NodeFromJson(j);
  if (n.ok() && !node_id.empty()) n->node = node_id;
  return n;
}

StatusOr<JobLedger> JobFromJson(const json& j) {
  try {
    JobLedger job;
    job.begin = j.at("begin_ms").get<Ms>();
    job.until = j.at("until_ms").get<Ms>();
    job.finished = j.value("finished", false);
    job.steps_known = j.value("steps_known", false);
    job.progress_known = j.value("progress_known", false);
    auto totals = WholeTotals(j, "the job", job.begin, "begin_ms", job.until);
    if (!totals.ok()) return totals.status();
    job.totals = *totals;
    if (auto s = BodyFrom(j, "the job", job.begin, job.until, job.segments, job.incidents);
        !s.ok()) {
      return s;
    }
    return job;
  } catch (const json::exception& e) {
    return Bad(std::string("not a job's ledger: ") + e.what());
  }
}

Ordered JobJson(const JobLedger& job) {
  Ordered o = Ordered::object();
  Head(o, job.totals, Summary(job));
  o["begin_ms"] = job.begin;
  o["until_ms"] = job.until;
  Body(o, job.finished, job.steps_known, job.progress_known, job.totals, job.incidents,
       job.segments);
  return o;
}

Ordered FileJson(const JobLedger& job) {
  Ordered j = Ordered::object();
  j["summary"] = Summary(job);
  j["job"] = JobJson(job);
  Ordered nodes = Ordered::array();
  for (const auto& n : job.nodes) nodes.push_back(ToJson(n));
  j["nodes"] = std::move(nodes);
  return j;
}

StatusOr<std::vector<NodeLedger>> NodesFromFile(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(what + " is not JSON");
  if (!j.is_object() || !j.contains("nodes") || !j.at("nodes").is_array()) {
    return Bad(what + " has no \"nodes\" list (is it a --goodput-file?)");
  }
  std::vector<NodeLedger> nodes;
  for (const auto& n : j.at("nodes")) {
    auto node = NodeFromJson(n);
    if (!node.ok()) return Status(node.status().code(), what + ": " + node.status().message());
    nodes.push_back(std::move(node).value());
  }
  if (nodes.empty()) return Bad(what + " names no node");
  return nodes;
}

}  // namespace crun::goodput
