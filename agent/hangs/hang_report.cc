#include "agent/hangs/hang_report.h"

#include <set>

#include "agent/hangs/hang_watch.h"
#include "agent/hangs/stack_summary.h"

namespace crun::agent {
namespace {

std::string Secs(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

}  // namespace

std::string FormatHang(const HangReport& h) {
  std::string out = "Hang:\n";
  std::vector<int> others;
  double least = 0, most = 0;
  for (const auto& r : h.ranks) {
    if (r.hung) {
      // The cause may name the state already ("it was stopped (T: ...)").
      const std::string state = DescribeState(r.state);
      out += "  rank " + std::to_string(r.rank) + " on " + r.host + " (local rank " +
             std::to_string(r.local_rank) + ", pid " + std::to_string(r.pid) + "): " + r.cause +
             (r.cause.find(state) == std::string::npos ? " (" + state + ")" : "") + "\n";
      continue;
    }
    if (others.empty() || r.silent_s < least) least = r.silent_s;
    if (others.empty() || r.silent_s > most) most = r.silent_s;
    others.push_back(r.rank);
  }
  if (!others.empty()) {
    out += "  " + std::string(others.size() == 1 ? "rank " : "ranks ") + RankRanges(others) +
           ": last progress " + Secs(least) + (most > least ? " to " + Secs(most) : "") +
           " before (waiting for the rank above, by their stacks, or not yet past the "
           "timeout)\n";
  }
  for (const auto& n : h.notes) out += "  " + n + "\n";
  if (h.stacks.empty()) return out;
  out += "Where every rank was (stacks read before stopping anything):\n";
  std::set<int> hung;
  for (const auto& r : h.ranks) {
    if (r.hung) hung.insert(r.rank);
  }
  out += FormatStacks(h.stacks, hung);
  if (!h.stacks_dir.empty()) out += "Every rank's stacks: " + h.stacks_dir + "\n";
  char timing[160];
  std::snprintf(timing, sizeof timing,
                "(declared %.0f ms after the deadline; stacks of %zu ranks read in %.0f ms)\n",
                h.declared_late_ms, h.stacks.size(), h.stacks_ms);
  out += timing;
  return out;
}

nlohmann::json HangJson(const HangReport& h) {
  nlohmann::json j;
  j["ranks"] = nlohmann::json::array();
  for (const auto& r : h.ranks) {
    j["ranks"].push_back({{"host", r.host},
                          {"rank", r.rank},
                          {"local_rank", r.local_rank},
                          {"pid", r.pid},
                          {"hung", r.hung},
                          {"silent_seconds", r.silent_s},
                          {"state", std::string(1, r.state)},
                          {"cause", r.cause}});
  }
  std::set<int> hung;
  for (const auto& r : h.ranks) {
    if (r.hung) hung.insert(r.rank);
  }
  j["summary"] = GroupSummary(h.stacks, hung);
  j["stacks"] = nlohmann::json::array();
  for (const auto& s : h.stacks) j["stacks"].push_back(StacksJson(s));
  j["stacks_dir"] = h.stacks_dir;
  j["timing"] = {{"declared_late_ms", h.declared_late_ms},
                 {"stacks_ms", h.stacks_ms},
                 {"report_ms", h.report_ms}};
  j["notes"] = h.notes;
  return j;
}

}  // namespace crun::agent
