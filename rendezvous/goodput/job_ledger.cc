#include "rendezvous/goodput/job_ledger.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>

namespace crun::goodput {
namespace {

// The order in which a node holds the job back: the first with a member in it wins.
constexpr std::array<Category, kCategories> kPrecedence{Category::kDetecting, Category::kRestarting,
                                                        Category::kWaiting,   Category::kStarting,
                                                        Category::kReloading, Category::kRedone,
                                                        Category::kTraining};

std::vector<Segment> CombineSegments(const std::vector<NodeLedger>& nodes, Ms begin, Ms until) {
  // +1 at a member segment's begin, -1 at its end, per category.
  std::vector<std::pair<Ms, std::pair<Category, int>>> edges;
  for (const auto& n : nodes) {
    for (const auto& s : n.segments) {
      if (!s.member) continue;
      edges.push_back({s.begin, {s.category, +1}});
      edges.push_back({s.end, {s.category, -1}});
    }
  }
  std::sort(edges.begin(), edges.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::array<int, kCategories> count{};
  std::vector<Segment> out;
  auto add = [&](Ms from, Ms to) {
    if (to <= from) return;
    Category c = Category::kWaiting;  // no member accounts for it
    for (Category p : kPrecedence) {
      if (count[static_cast<std::size_t>(p)] > 0) {
        c = p;
        break;
      }
    }
    if (!out.empty() && out.back().category == c && out.back().end == from) {
      out.back().end = to;
    } else {
      out.push_back({c, from, to, true});
    }
  };
  Ms at = begin;
  for (std::size_t i = 0; i < edges.size();) {
    const Ms t = std::clamp(edges[i].first, begin, until);
    add(at, t);
    at = std::max(at, t);
    for (; i < edges.size() && std::clamp(edges[i].first, begin, until) == t; ++i) {
      count[static_cast<std::size_t>(edges[i].second.first)] += edges[i].second.second;
    }
  }
  add(at, until);
  // Once the job has trained, a node that starts (a replacement) restarts the job.
  bool trained = false;
  for (Segment& s : out) {
    trained = trained || s.category == Category::kTraining;
    if (trained && s.category == Category::kStarting) s.category = Category::kRestarting;
  }
  std::vector<Segment> merged;
  for (const Segment& s : out) {
    if (!merged.empty() && merged.back().category == s.category && merged.back().end == s.begin) {
      merged.back().end = s.end;
    } else {
      merged.push_back(s);
    }
  }
  return merged;
}

// The job's categories over [from, to).
Totals Within(const std::vector<Segment>& segments, Ms from, Ms to) {
  Totals t{};
  for (const auto& s : segments) {
    const Ms b = std::max(s.begin, from), e = std::min(s.end, to);
    if (e > b) At(t, s.category) += e - b;
  }
  return t;
}

std::vector<Incident> CombineIncidents(const std::vector<NodeLedger>& nodes,
                                       const std::vector<Segment>& segments, Ms until) {
  std::vector<Incident> all;
  for (const auto& n : nodes) all.insert(all.end(), n.incidents.begin(), n.incidents.end());
  std::sort(all.begin(), all.end(),
            [](const Incident& a, const Incident& b) { return a.fault < b.fault; });
  std::vector<Incident> out;
  Ms end = std::numeric_limits<Ms>::min();
  bool open = false;  // the last one has a node that has not resumed
  for (const Incident& i : all) {
    if (!out.empty() && (open || i.fault < end)) {
      Incident& j = out.back();
      j.known = std::min(j.known, i.known);
      if (i.step_at_failure) {
        j.step_at_failure =
            std::max(j.step_at_failure.value_or(*i.step_at_failure), *i.step_at_failure);
      }
      if (i.resumed_from) {
        j.resumed_from = std::min(j.resumed_from.value_or(*i.resumed_from), *i.resumed_from);
      }
      if (i.resumed == 0) open = true;
      j.resumed = open ? 0 : std::max(j.resumed, i.resumed);
      end = std::max(end, i.resumed);
      continue;
    }
    out.push_back(i);
    open = i.resumed == 0;
    end = i.resumed;
  }
  for (Incident& j : out) {
    j.cost = Within(segments, j.fault, j.resumed == 0 ? until : j.resumed);
    At(j.cost, Category::kTraining) = 0;
  }
  return out;
}

std::string Percent(double ratio) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", ratio * 100.0);
  return buf;
}

}  // namespace

JobLedger Combine(std::vector<NodeLedger> nodes) {
  std::sort(nodes.begin(), nodes.end(),
            [](const NodeLedger& a, const NodeLedger& b) { return a.node < b.node; });
  JobLedger job;
  if (nodes.empty()) return job;
  job.begin = std::numeric_limits<Ms>::max();
  job.until = std::numeric_limits<Ms>::min();
  job.finished = true;
  for (const auto& n : nodes) {
    job.begin = std::min(job.begin, n.launched);
    job.until = std::max(job.until, n.until);
    // A node that never ran workers (a spare that only waited) says nothing either way.
    job.steps_known = job.steps_known || n.steps_known;
    job.progress_known = job.progress_known || n.progress_known;
    job.finished = job.finished && n.finished;
  }
  job.segments = CombineSegments(nodes, job.begin, job.until);
  for (const auto& s : job.segments) At(job.totals, s.category) += s.end - s.begin;
  job.incidents = CombineIncidents(nodes, job.segments, job.until);
  job.nodes = std::move(nodes);
  return job;
}

double Goodput(const Totals& totals) {
  const Ms wall = Sum(totals);
  return wall > 0 ? static_cast<double>(At(totals, Category::kTraining)) / wall : 0.0;
}

std::string Spoken(Ms ms) {
  ms = std::max<Ms>(ms, 0);
  char buf[64];
  if (ms < 10'000 && ms % 1000 != 0) {
    std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms) / 1000.0);
    return buf;
  }
  const Ms s = (ms + 500) / 1000;
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%lld s", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lld m %lld s", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld h %lld m", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  }
  return buf;
}

std::string Summary(const Totals& t, std::size_t incidents, bool steps_known, bool progress_known) {
  const Ms wall = Sum(t);
  if (!progress_known) {
    return "goodput unknown: the workers report no progress (crun_worker.step(n), "
           "crun::worker::Step(n) or a heartbeat), so crun cannot tell training from starting; "
           "wall time " +
           Spoken(wall);
  }
  std::string out = "goodput " + Percent(Goodput(t)) + " (" + Spoken(At(t, Category::kTraining)) +
                    " of " + Spoken(wall) + " training)";
  if (At(t, Category::kStarting) > 0) out += "; starting " + Spoken(At(t, Category::kStarting));
  Ms lost = 0;
  std::string parts;
  for (Category c : {Category::kDetecting, Category::kRestarting, Category::kReloading,
                     Category::kRedone, Category::kWaiting}) {
    if (At(t, c) <= 0) continue;
    lost += At(t, c);
    parts +=
        std::string(parts.empty() ? "" : ", ") + std::string(NameOf(c)) + " " + Spoken(At(t, c));
  }
  if (incidents > 0 || lost > 0) {
    out += "; " + std::to_string(incidents) + (incidents == 1 ? " incident" : " incidents");
    out += lost > 0 ? " cost " + Spoken(lost) + ": " + parts : " cost nothing";
  }
  if (!steps_known) out += "; redone: unknown, the workers report no steps";
  return out;
}

void CarryOn(NodeLedger& node, Ms until) {
  if (node.finished || node.segments.empty() || until <= node.until) return;
  Segment& last = node.segments.back();
  At(node.totals, last.category) += until - node.until;
  last.end = until;
  node.until = until;
}

std::string Summary(const JobLedger& job) {
  return Summary(job.totals, job.incidents.size(), job.steps_known, job.progress_known);
}

std::string Summary(const NodeLedger& node) {
  return Summary(node.totals, node.incidents.size(), node.steps_known, node.progress_known);
}

}  // namespace crun::goodput
