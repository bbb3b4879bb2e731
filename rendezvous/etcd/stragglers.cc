#include "rendezvous/etcd/stragglers.h"

#include <algorithm>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "rendezvous/rules/rules.h"

namespace crun::etcd {
namespace {

using json = nlohmann::json;

json VerdictJson(const rdzv::msg::StragglerVerdict& v) {
  return {{"rank", v.change.rank},
          {"window", v.change.window},
          {"ratio", v.change.ratio},
          {"host", v.host}};
}

rdzv::msg::StragglerVerdict VerdictFrom(const json& j, bool named) {
  rdzv::msg::StragglerVerdict v;
  v.change.rank = j.at("rank").get<int>();
  v.change.window = j.at("window").get<std::int64_t>();
  v.change.ratio = j.at("ratio").get<double>();
  v.change.named = named;
  v.host = j.at("host").get<std::string>();
  return v;
}

bool SameRank(const rdzv::msg::StragglerVerdict& v, int rank) { return v.change.rank == rank; }

}  // namespace

std::string FiguresKey(const Keys& keys, const std::string& node_id) {
  return keys.prefix + "figures/" + node_id;
}

std::string StragglersKey(const Keys& keys) { return keys.announce() + "stragglers"; }

std::string EncodeFigures(const NodeFigures& f) {
  json figures = json::array();
  for (const auto& s : f.figures) figures.push_back({s.rank, s.window, s.compute.count()});
  return json{{"round", f.round}, {"figures", std::move(figures)}}.dump();
}

StatusOr<NodeFigures> DecodeFigures(const std::string& node_id, const std::string& text) {
  return Guarded("figures of '" + node_id + "'", [&]() -> StatusOr<NodeFigures> {
    const json j = json::parse(text);
    NodeFigures f;
    f.round = j.at("round").get<int>();
    for (const auto& s : j.at("figures")) {
      if (!s.is_array() || s.size() != 3) throw std::invalid_argument("a figure is not [r, w, us]");
      f.figures.push_back({s[0].get<int>(), s[1].get<std::int64_t>(),
                           std::chrono::microseconds(s[2].get<std::int64_t>())});
    }
    return f;
  });
}

std::string EncodeVerdicts(const SlowVerdicts& v) {
  json named = json::array();
  json cleared = json::array();
  for (const auto& x : v.named) named.push_back(VerdictJson(x));
  for (const auto& x : v.cleared) cleared.push_back(VerdictJson(x));
  return json{{"round", v.round}, {"named", std::move(named)}, {"cleared", std::move(cleared)}}
      .dump();
}

StatusOr<SlowVerdicts> DecodeVerdicts(const std::string& text) {
  return Guarded("slow ranks", [&]() -> StatusOr<SlowVerdicts> {
    const json j = json::parse(text);
    SlowVerdicts v;
    v.round = j.at("round").get<int>();
    for (const auto& x : j.at("named")) v.named.push_back(VerdictFrom(x, true));
    for (const auto& x : j.at("cleared")) v.cleared.push_back(VerdictFrom(x, false));
    return v;
  });
}

void FigureJudge::Follow(const JobDoc& doc) {
  const bool running = doc.state.phase == rdzv::Phase::kRunning;
  if (running == running_ && (!running || doc.state.round == verdicts_.round)) return;
  running_ = running;
  state_ = {};
  owners_.Clear();
  hosts_.clear();
  verdicts_ = {};
  if (!running) return;
  verdicts_.round = doc.state.round;
  state_.world_size = doc.world_size;
  std::vector<rdzv::NodeDescription> nodes;
  for (const auto& m : doc.state.members) {
    nodes.push_back(m.node);
    hosts_[m.node.node_id] = m.node.host;
  }
  for (const auto& a : rdzv::AssignRanks(nodes)) owners_.Add(a.base_rank, a.node_id);
}

bool FigureJudge::Fold(const std::string& node_id, const NodeFigures& put) {
  if (!running_ || put.round != verdicts_.round) return false;
  bool changed = false;
  for (const auto& figure : put.figures) {
    // A node speaks for its own ranks only.
    const std::string* sender = owners_.Of(figure.rank);
    if (figure.rank < 0 || figure.rank >= state_.world_size || sender == nullptr ||
        *sender != node_id) {
      continue;
    }
    for (const auto& change : rdzv::OnComputeSample(state_, figure, settings_)) {
      const std::string* owner = owners_.Of(change.rank);
      const rdzv::msg::StragglerVerdict v{change, owner == nullptr ? "" : hosts_[*owner]};
      auto drop = [&](std::vector<rdzv::msg::StragglerVerdict>& list) {
        list.erase(std::remove_if(list.begin(), list.end(),
                                  [&](const auto& x) { return SameRank(x, change.rank); }),
                   list.end());
      };
      drop(verdicts_.named);
      drop(verdicts_.cleared);
      (change.named ? verdicts_.named : verdicts_.cleared).push_back(v);
      changed = true;
    }
  }
  return changed;
}

std::vector<rdzv::msg::StragglerVerdict> NewVerdicts(const SlowVerdicts& v, int round,
                                                     std::set<int>& said) {
  std::vector<rdzv::msg::StragglerVerdict> out;
  if (v.round != round) return out;
  for (const auto& x : v.cleared) {
    if (said.erase(x.change.rank) != 0) out.push_back(x);
  }
  for (const auto& x : v.named) {
    if (said.insert(x.change.rank).second) out.push_back(x);
  }
  return out;
}

std::map<std::string, std::vector<rdzv::StragglerChange>> NamedByNode(const SlowVerdicts& v,
                                                                      const JobDoc& doc) {
  std::map<std::string, std::vector<rdzv::StragglerChange>> out;
  if (doc.state.phase != rdzv::Phase::kRunning || v.round != doc.state.round) return out;
  std::vector<rdzv::NodeDescription> nodes;
  for (const auto& m : doc.state.members) nodes.push_back(m.node);
  rdzv::RankOwners owners;
  for (const auto& a : rdzv::AssignRanks(nodes)) owners.Add(a.base_rank, a.node_id);
  for (const auto& x : v.named) {
    if (const std::string* owner = owners.Of(x.change.rank)) out[*owner].push_back(x.change);
  }
  return out;
}

}  // namespace crun::etcd
