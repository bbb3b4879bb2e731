#include "rendezvous/etcd/job.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <stdexcept>
#include <variant>

#include <nlohmann/json.hpp>

#include "rendezvous/etcd/stragglers.h"
#include "rendezvous/service/job_status.h"

namespace crun::etcd {
namespace {

using json = nlohmann::json;
using rdzv::Millis;
using rdzv::Phase;
using rdzv::TimePoint;

// Lost node ids kept in the document (the rules append one per loss).
constexpr std::size_t kMaxLost = 64;

std::int64_t ToWall(TimePoint t, TimePoint now, WallClock::time_point wall) {
  const auto at = wall + std::chrono::duration_cast<WallClock::duration>(t - now);
  return std::chrono::duration_cast<Millis>(at.time_since_epoch()).count();
}

TimePoint FromWall(std::int64_t ms, TimePoint now, WallClock::time_point wall) {
  const WallClock::time_point at{std::chrono::duration_cast<WallClock::duration>(Millis(ms))};
  return now + std::chrono::duration_cast<TimePoint::duration>(at - wall);
}

std::optional<Phase> PhaseFrom(const std::string& name) {
  for (Phase p : {Phase::kGathering, Phase::kRunning, Phase::kFailed, Phase::kSucceeded}) {
    if (name == rdzv::PhaseName(p)) return p;
  }
  return std::nullopt;
}

// A list of TCP ports; anything else (0, above 65535, not a number) throws, naming it.
std::vector<std::uint16_t> PortsFrom(const json& j) {
  std::vector<std::uint16_t> ports;
  for (const auto& p : j) {
    const auto v = p.get<std::int64_t>();
    if (v < 1 || v > 65535) throw std::out_of_range(std::to_string(v) + " is not a TCP port");
    ports.push_back(static_cast<std::uint16_t>(v));
  }
  return ports;
}

json NodeJson(const rdzv::NodeDescription& n) {
  json j = {{"id", n.node_id}, {"host", n.host}, {"nproc", n.nproc}};
  if (n.requested_rank) j["rank"] = *n.requested_rank;
  if (!n.address.empty()) j["address"] = n.address;
  if (!n.ports.empty()) j["ports"] = n.ports;
  return j;
}

rdzv::NodeDescription NodeFrom(const json& j) {
  rdzv::NodeDescription n;
  n.node_id = j.at("id").get<std::string>();
  n.host = j.at("host").get<std::string>();
  n.nproc = j.at("nproc").get<int>();
  if (j.contains("rank")) n.requested_rank = j["rank"].get<int>();
  n.address = j.value("address", std::string());
  if (j.contains("ports")) n.ports = PortsFrom(j["ports"]);
  return n;
}

// Settings as etcd keeps them, field by field from the one list (rules/settings.h); contracts
// by name. A field older writers lacked keeps its default; a required one missing throws.
json SettingsJson(const rdzv::Settings& s) {
  json j = json::object();
  for (const rdzv::SettingField& f : rdzv::SettingFields()) {
    if (f.kind == rdzv::SettingField::Kind::kContracts) {
      j[rdzv::WireName(f)] = s.contracts.ToString();
    } else {
      j[rdzv::WireName(f)] = f.get(s);
    }
  }
  return j;
}

rdzv::Settings SettingsFrom(const json& j) {
  rdzv::Settings s;
  for (const rdzv::SettingField& f : rdzv::SettingFields()) {
    const std::string key = rdzv::WireName(f);
    if (f.json_optional && !j.contains(key)) continue;
    if (f.kind == rdzv::SettingField::Kind::kContracts) {
      auto contracts = ParseContracts(j.at(key).get<std::string>());
      if (!contracts.ok()) throw std::invalid_argument(contracts.status().message());
      s.contracts = *contracts;
    } else {
      f.set(s, j.at(key).get<std::int64_t>());
    }
  }
  return s;
}

// A JSON object when the text is one, else the text as a string.
json Embedded(const std::string& text) {
  if (text.empty()) return nullptr;
  auto parsed = json::parse(text, nullptr, false);
  return parsed.is_discarded() ? json(text) : parsed;
}

std::string Unembedded(const json& j) {
  if (j.is_null()) return {};
  if (j.is_string()) return j.get<std::string>();
  return j.dump();
}

std::optional<TimePoint> Earliest(const rdzv::State& s) {
  if (s.phase != Phase::kGathering) return std::nullopt;
  std::optional<TimePoint> t = s.join_deadline;
  if (s.last_call_deadline && (!t || *s.last_call_deadline < *t)) t = s.last_call_deadline;
  return t;
}

// The id after `dir` in `key`, if the key is directly under it.
std::optional<std::string> Child(const std::string& key, const std::string& dir) {
  if (key.size() <= dir.size() || key.compare(0, dir.size(), dir) != 0) return std::nullopt;
  return key.substr(dir.size());
}

}  // namespace

Keys::Keys(const std::string& root, const std::string& run_id) {
  std::string r = root;
  while (!r.empty() && r.back() == '/') r.pop_back();
  prefix = r + "/" + run_id + "/";
}

std::string Keys::round(int n) const {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08d", n);
  return rounds() + buf;
}

std::string EncodeNode(const NodeRecord& r) {
  json j = NodeJson(r.node);
  j["addresses"] = r.addresses;
  j["settings"] = SettingsJson(r.settings);
  return j.dump();
}

StatusOr<NodeRecord> DecodeNode(const std::string& id, const std::string& text) {
  return Guarded("node record of '" + id + "'", [&]() -> StatusOr<NodeRecord> {
    const json j = json::parse(text);
    NodeRecord r;
    r.node = NodeFrom(j);
    if (r.node.node_id != id) {
      return ProtocolError("node record under '" + id + "' names '" + r.node.node_id + "'");
    }
    r.addresses = j.value("addresses", std::vector<std::string>{});
    r.settings = SettingsFrom(j.at("settings"));
    return r;
  });
}

std::string EncodeJoin(const JoinRecord& r) {
  if (r.ports.empty()) return std::to_string(r.gathering);
  return json{{"gathering", r.gathering}, {"ports", r.ports}}.dump();
}

StatusOr<JoinRecord> DecodeJoin(const std::string& id, const std::string& text) {
  return Guarded("join of '" + id + "'", [&]() -> StatusOr<JoinRecord> {
    const json j = json::parse(text);
    JoinRecord r;
    if (j.is_number_integer()) {
      r.gathering = j.get<int>();
      return r;
    }
    r.gathering = j.at("gathering").get<int>();
    r.ports = PortsFrom(j.at("ports"));
    return r;
  });
}

std::string EncodeRank(const RankRecord& r) {
  json j = {{"token", r.token}, {"round", r.round}, {"group_world_size", r.group_world_size}};
  if (r.spare) {
    j["spare"] = true;
  } else {
    j["group_rank"] = r.group_rank;
    j["base_rank"] = r.base_rank;
  }
  return j.dump();
}

StatusOr<RankRecord> DecodeRank(const std::string& id, const std::string& text) {
  return Guarded("rank record of '" + id + "'", [&]() -> StatusOr<RankRecord> {
    const json j = json::parse(text);
    RankRecord r;
    r.token = j.at("token").get<std::string>();
    r.round = j.at("round").get<int>();
    r.spare = j.value("spare", false);
    r.group_world_size = j.at("group_world_size").get<int>();
    if (!r.spare) {
      r.group_rank = j.at("group_rank").get<int>();
      r.base_rank = j.at("base_rank").get<int>();
    }
    return r;
  });
}

StatusOr<RoundHistory> DecodeRound(const std::string& text) {
  return Guarded("round history", [&]() -> StatusOr<RoundHistory> {
    const json j = json::parse(text);
    RoundHistory h;
    h.round = j.at("round").get<int>();
    h.world_size = j.at("world_size").get<int>();
    h.nodes = j.value("nodes", std::vector<std::string>{});
    h.spares = j.value("spares", std::vector<std::string>{});
    return h;
  });
}

std::string EncodeReport(const Report& r) {
  json j = {{"success", r.success}};
  if (!r.success) {
    j["what"] = r.what;
    j["exit_code"] = r.exit_code;
    j["report"] = Embedded(r.report_json);
  }
  return j.dump();
}

StatusOr<Report> DecodeReport(const std::string& text) {
  return Guarded("report", [&]() -> StatusOr<Report> {
    const json j = json::parse(text);
    Report r;
    r.success = j.at("success").get<bool>();
    if (!r.success) {
      r.what = j.at("what").get<std::string>();
      r.exit_code = j.at("exit_code").get<int>();
      r.report_json = Unembedded(j.value("report", json(nullptr)));
    }
    return r;
  });
}

std::string EncodeUnhealthy(const rdzv::UnhealthyNode& u) {
  return json{{"host", u.host}, {"reason", u.reason}}.dump();
}

StatusOr<rdzv::UnhealthyNode> DecodeUnhealthy(const std::string& id, const std::string& text) {
  return Guarded("unhealthy node", [&]() -> StatusOr<rdzv::UnhealthyNode> {
    const json j = json::parse(text);
    return rdzv::UnhealthyNode{id, j.at("host").get<std::string>(),
                               j.at("reason").get<std::string>()};
  });
}

std::string EncodeJob(const JobDoc& d, TimePoint now, WallClock::time_point wall) {
  const auto& s = d.state;
  auto when = [&](const std::optional<TimePoint>& t) -> json {
    return t ? json(ToWall(*t, now, wall)) : json(nullptr);
  };
  json members = json::array();
  for (const auto& m : s.members) {
    json n = NodeJson(m.node);
    n["succeeded"] = m.succeeded;
    members.push_back(std::move(n));
  }
  auto nodes = [](const std::vector<rdzv::NodeDescription>& v) {
    json a = json::array();
    for (const auto& n : v) a.push_back(NodeJson(n));
    return a;
  };
  json times = json::array();
  for (auto t : s.round_times) times.push_back(ToWall(t, now, wall));
  json unhealthy = json::array();
  for (const auto& u : s.unhealthy) {
    unhealthy.push_back({{"node_id", u.node_id}, {"host", u.host}, {"reason", u.reason}});
  }
  const std::size_t lost_from = s.lost_hosts.size() > kMaxLost ? s.lost_hosts.size() - kMaxLost : 0;
  json j = {{"job", d.job},
            {"gathering", d.gathering},
            {"settings", SettingsJson(s.settings)},
            {"phase", rdzv::PhaseName(s.phase)},
            {"round", s.round},
            {"joined", nodes(s.joined)},
            {"join_deadline_ms", when(s.join_deadline)},
            {"last_call_deadline_ms", when(s.last_call_deadline)},
            {"members", std::move(members)},
            {"spares", nodes(s.spares)},
            {"lost",
             std::vector<std::string>(s.lost_hosts.begin() + static_cast<std::ptrdiff_t>(lost_from),
                                      s.lost_hosts.end())},
            {"restarts_used", s.restarts_used},
            {"round_times_ms", std::move(times)},
            {"paid_round", s.paid_round},
            {"crash_loop", {{"way", s.crash_loop.way}, {"attempts", s.crash_loop.attempts}}},
            {"unhealthy", std::move(unhealthy)},
            {"unhealthy_reports", s.unhealthy_reports},
            {"stop", {{"reason", d.stop_reason}, {"spends_restart", d.stop_spends_restart}}},
            {"last_failure", d.last_failure},
            {"world_size", d.world_size},
            {"judges_stragglers", true}};
  if (d.retention_lease != 0) j["retention_lease"] = d.retention_lease;
  if (!d.ranks_token.empty()) j["ranks_token"] = d.ranks_token;
  if (d.outcome) {
    j["outcome"] = {{"success", d.outcome->success},
                    {"exit_code", d.outcome->exit_code},
                    {"reason", d.outcome->reason},
                    {"root_node_id", d.outcome->root_node_id},
                    {"root_report", Embedded(d.outcome->root_report_json)}};
  }
  return j.dump();
}

StatusOr<JobDoc> DecodeJob(const std::string& text, TimePoint now, WallClock::time_point wall) {
  return Guarded("job document", [&]() -> StatusOr<JobDoc> {
    const json j = json::parse(text);
    JobDoc d;
    d.job = j.at("job").get<std::uint64_t>();
    d.gathering = j.at("gathering").get<int>();
    auto& s = d.state;
    s.settings = SettingsFrom(j.at("settings"));
    auto phase = PhaseFrom(j.at("phase").get<std::string>());
    if (!phase) return ProtocolError("unknown phase '" + j["phase"].get<std::string>() + "'");
    s.phase = *phase;
    s.round = j.at("round").get<int>();
    for (const auto& n : j.at("joined")) s.joined.push_back(NodeFrom(n));
    auto when = [&](const char* key) -> std::optional<TimePoint> {
      if (!j.contains(key) || j[key].is_null()) return std::nullopt;
      return FromWall(j[key].get<std::int64_t>(), now, wall);
    };
    s.join_deadline = when("join_deadline_ms");
    s.last_call_deadline = when("last_call_deadline_ms");
    for (const auto& n : j.at("members")) {
      rdzv::Member m;
      m.node = NodeFrom(n);
      m.succeeded = n.value("succeeded", false);
      // Liveness is the node's lease: a member whose nodes/ key exists is alive now.
      m.last_heartbeat = now;
      s.member_index[m.node.node_id] = s.members.size();
      if (m.succeeded) ++s.members_succeeded;
      s.members.push_back(std::move(m));
    }
    for (const auto& n : j.at("spares")) s.spares.push_back(NodeFrom(n));
    s.lost_hosts = j.at("lost").get<std::vector<std::string>>();
    s.restarts_used = j.at("restarts_used").get<int>();
    for (const auto& t : j.at("round_times_ms")) {
      s.round_times.push_back(FromWall(t.get<std::int64_t>(), now, wall));
    }
    s.paid_round = j.value("paid_round", false);  // absent from documents before it
    if (const auto loop = j.find("crash_loop"); loop != j.end()) {  // as paid_round
      s.crash_loop = {loop->at("way").get<std::string>(), loop->at("attempts").get<int>()};
    }
    if (const auto u = j.find("unhealthy"); u != j.end()) {  // as paid_round
      for (const auto& n : *u) {
        s.unhealthy.push_back({n.at("node_id").get<std::string>(), n.at("host").get<std::string>(),
                               n.at("reason").get<std::string>()});
      }
    }
    s.unhealthy_reports = j.value("unhealthy_reports", 0);
    for (const auto& n : s.joined) s.present.insert(n.node_id);
    for (const auto& m : s.members) s.present.insert(m.node.node_id);
    for (const auto& n : s.spares) s.present.insert(n.node_id);
    d.stop_reason = j.at("stop").at("reason").get<std::string>();
    d.stop_spends_restart = j.at("stop").at("spends_restart").get<bool>();
    d.last_failure = j.value("last_failure", std::string());
    d.world_size = j.value("world_size", 0);
    d.judges_stragglers = j.value("judges_stragglers", false);
    d.retention_lease = j.value("retention_lease", std::int64_t{0});
    d.ranks_token = j.value("ranks_token", std::string());
    if (j.contains("outcome") && !j["outcome"].is_null()) {
      const auto& o = j["outcome"];
      Outcome out;
      out.success = o.at("success").get<bool>();
      out.exit_code = o.at("exit_code").get<int>();
      out.reason = o.at("reason").get<std::string>();
      out.root_node_id = o.value("root_node_id", std::string());
      out.root_report_json = Unembedded(o.value("root_report", json(nullptr)));
      d.outcome = std::move(out);
    }
    return d;
  });
}

std::string EncodePublicJob(const JobDoc& doc, TimePoint now, WallClock::time_point wall) {
  JobDoc pub = doc;
  pub.state.joined.clear();
  pub.state.join_deadline.reset();
  pub.state.last_call_deadline.reset();
  pub.state.round_times.clear();
  // Each node reads its place from ranks/ (RankRecord): the list goes to every node only where
  // their workers need every node's address and ports (--contract).
  if (std::none_of(pub.state.members.begin(), pub.state.members.end(),
                   [](const rdzv::Member& m) { return !m.node.ports.empty(); })) {
    pub.state.members.clear();
  }
  for (auto& m : pub.state.members) m.succeeded = false;
  return EncodeJob(pub, now, wall);
}

std::string Decider(const Keys& keys, const Mirror& mirror) {
  auto kv = mirror.find(keys.decider());
  return kv == mirror.end() ? std::string() : kv->second.value;
}

namespace {

struct NodeEntry {
  NodeRecord record;
  const KeyValue* kv = nullptr;
};

// The entries directly under `dir`, in the order etcd created them.
std::vector<std::pair<std::string, const KeyValue*>> Children(const Mirror& mirror,
                                                              const std::string& dir) {
  std::vector<std::pair<std::string, const KeyValue*>> out;
  for (auto it = mirror.lower_bound(dir); it != mirror.end(); ++it) {
    auto id = Child(it->first, dir);
    if (!id) break;
    if (id->find('/') != std::string::npos) continue;
    out.emplace_back(*id, &it->second);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second->create_revision < b.second->create_revision;
  });
  return out;
}

// What the rules weigh of a node's report: its JSON, read back; a report that does not read
// (not crun's) is weighed by its words alone, and so never counts towards a crash loop.
rdzv::Failure FailureOf(const Report& r) {
  auto report = crun::report::FromJson(r.report_json);
  rdzv::Failure f;
  if (report.ok()) f = rdzv::FailureOf(*report);
  f.what = r.what;
  return f;
}

}  // namespace

namespace {

// One Decide(): the steps below, in order, each a few lines of the rules' bookkeeping.
class Deciding {
 public:
  Deciding(const Keys& keys, const Mirror& mirror, TimePoint now, WallClock::time_point wall,
           const Retention& retention)
      : keys_(keys), mirror_(mirror), now_(now), wall_(wall), retention_(retention) {}

  Decision Run() && {
    if (!CheckLayout()) return std::move(out_);
    ReadNodes();
    if (!LoadJob()) return std::move(out_);
    RenewEndedJob();
    LoseAbsentNodes();
    ApplyReports();
    ApplyUnhealthy();
    ApplyJoins();
    Apply(rdzv::OnTick(std::move(doc_.state), now_));
    if (!Retain()) return std::move(out_);
    Write();
    return std::move(out_);
  }

 private:
  // Another crun version's keys: leave them alone.
  bool CheckLayout() {
    auto layout = mirror_.find(keys_.layout());
    if (layout == mirror_.end() || layout->second.value == kLayout) return true;
    out_.error =
        ProtocolError(keys_.layout() + " is '" + layout->second.value + "', this crun writes '" +
                      kLayout + "': another crun version owns run '" + keys_.prefix + "'");
    return false;
  }

  void ReadNodes() {
    for (const auto& [id, kv] : Children(mirror_, keys_.nodes())) {
      auto r = DecodeNode(id, kv->value);
      if (!r.ok()) {
        out_.log.push_back("ignoring " + kv->key + ": " + r.status().message());
        continue;
      }
      nodes_[id] = {std::move(r).value(), kv};
    }
  }

  // The settings of the oldest node whose record could be read (a renewed job's).
  rdzv::Settings OldestSettings() const {
    for (const auto& [id, kv] : Children(mirror_, keys_.nodes())) {
      if (nodes_.count(id)) return nodes_.at(id).record.settings;
    }
    return {};
  }

  // The job as the last decision left it, or a new one from the nodes; false: nothing to
  // decide (no job, no node), or a job that cannot be read (out_.error).
  bool LoadJob() {
    auto job_kv = mirror_.find(keys_.state());
    if (job_kv == mirror_.end()) {
      if (nodes_.empty()) return false;
      // The first agent's settings make the job; later ones must agree (the rules check).
      const auto oldest = Children(mirror_, keys_.nodes());
      const auto& first = nodes_.count(oldest.front().first) ? nodes_.at(oldest.front().first)
                                                             : nodes_.begin()->second;
      doc_.state.settings = first.record.settings;
      return true;
    }
    auto decoded = DecodeJob(job_kv->second.value, now_, wall_);
    if (!decoded.ok()) {
      out_.error = ProtocolError(keys_.job() + " cannot be read: " + decoded.status().message());
      return false;
    }
    doc_ = std::move(decoded).value();
    out_.job_mod_revision = job_kv->second.mod_revision;
    before_ = EncodeJob(doc_, now_, wall_);
    return true;
  }

  // A finished job whose agents have all gone: a new job on the same run id.
  void RenewEndedJob() {
    const bool ended = doc_.state.phase == Phase::kFailed || doc_.state.phase == Phase::kSucceeded;
    if (!ended || nodes_.empty()) return;
    const bool all_new = std::all_of(nodes_.begin(), nodes_.end(), [&](const auto& n) {
      return n.second.kv->create_revision > out_.job_mod_revision;
    });
    if (!all_new) return;
    JobDoc fresh;
    fresh.job = doc_.job + 1;
    fresh.gathering = doc_.gathering + 1;
    fresh.state.settings = OldestSettings();
    out_.log.push_back("job " + std::to_string(doc_.job) + " ended and its agents left: job " +
                       std::to_string(fresh.job) + " starts");
    doc_ = std::move(fresh);
    out_.ops.push_back({Op::Kind::kDeletePrefix, keys_.reports(), "", 0});
    out_.ops.push_back({Op::Kind::kDeletePrefix, keys_.stores(), "", 0});
    // Bound to the ended job's retention lease: the new job keeps its layout (put unbound);
    // the old job's history goes when that lease runs out.
    out_.ops.push_back({Op::Kind::kPut, keys_.layout(), kLayout, 0});
  }

  // Lost: in the job, but its lease (and so its nodes/ key) is gone.
  void LoseAbsentNodes() {
    std::vector<std::string> present(doc_.state.present.begin(), doc_.state.present.end());
    std::sort(present.begin(), present.end());
    for (const auto& id : present) {
      if (nodes_.count(id) != 0) continue;
      const auto heartbeat = doc_.state.settings.heartbeat_timeout.count();
      Apply(rdzv::OnNodeLost(std::move(doc_.state), id, now_,
                             "its etcd lease ended (the agent left, died, or was cut off for "
                             "longer than heartbeat_timeout " +
                                 std::to_string(heartbeat) + " ms)"));
    }
  }

  // How this gathering's rounds ended, first written first.
  void ApplyReports() {
    for (const auto& [id, kv] : Children(mirror_, keys_.reports(doc_.gathering))) {
      auto r = DecodeReport(kv->value);
      if (!r.ok()) {
        out_.log.push_back("ignoring " + kv->key + ": " + r.status().message());
        continue;
      }
      if (r->success) {
        Apply(rdzv::OnNodeSucceeded(std::move(doc_.state), id, now_));
        continue;
      }
      const int gathering = doc_.gathering;
      if (doc_.state.phase == Phase::kRunning && doc_.state.member_index.count(id) != 0) {
        root_node_ = id;
        root_report_ = *r;
        doc_.last_failure = r->what;
        out_.ops.push_back({Op::Kind::kPut, keys_.last_failure(), kv->value, 0});
      }
      Apply(rdzv::OnWorkerFailed(std::move(doc_.state), id, FailureOf(*r), now_));
      if (doc_.gathering != gathering) break;  // the rest belong to the round that just stopped
    }
  }

  // Nodes that failed their health check: counted, named, and their keys gone.
  void ApplyUnhealthy() {
    for (const auto& [id, kv] : Children(mirror_, keys_.unhealthy())) {
      out_.ops.push_back({Op::Kind::kDelete, kv->key, "", 0});
      auto u = DecodeUnhealthy(id, kv->value);
      if (!u.ok()) {
        out_.log.push_back("ignoring " + kv->key + ": " + u.status().message());
        continue;
      }
      out_.log.push_back("node '" + id + "' on " + u->host +
                         " failed its health check and stays out: " + u->reason);
      Apply(rdzv::OnUnhealthy(std::move(doc_.state), *u, now_));
    }
  }

  // Joins for this gathering, first come first.
  void ApplyJoins() {
    for (const auto& [id, kv] : Children(mirror_, keys_.joins())) {
      const auto join = DecodeJoin(id, kv->value);
      if (!join.ok() || join->gathering != doc_.gathering || doc_.state.present.count(id) != 0) {
        continue;
      }
      if (mirror_.count(keys_.refusal(id)) != 0) continue;
      auto n = nodes_.find(id);
      if (n == nodes_.end()) continue;  // its lease is gone with it
      rdzv::NodeDescription node = n->second.record.node;
      node.ports = join->ports;  // this round's
      // The address only matters with ports (--contract); without, the job document (one
      // entry per member, every agent reads it) stays as it was.
      if (node.ports.empty()) node.address.clear();
      Apply(rdzv::OnJoin(std::move(doc_.state), node, n->second.record.settings, now_));
    }
  }

  // The rules' next state, and what each of their actions means for etcd.
  void Apply(rdzv::Transition t) {
    doc_.state = std::move(t.state);
    for (auto& action : t.actions) {
      if (auto* round = std::get_if<rdzv::FormRound>(&action)) {
        FormRound(*round);
      } else if (auto* stop = std::get_if<rdzv::StopAndRejoin>(&action)) {
        out_.ops.push_back({Op::Kind::kDeletePrefix, keys_.reports(doc_.gathering), "", 0});
        ++doc_.gathering;
        doc_.stop_reason = stop->reason;
        doc_.stop_spends_restart = stop->spends_restart;
        out_.log.push_back("every node stops and rejoins: " + stop->reason);
      } else if (auto* fail = std::get_if<rdzv::FailJob>(&action)) {
        FailJob(*fail);
      } else if (std::holds_alternative<rdzv::SucceedJob>(action)) {
        doc_.outcome = Outcome{true, 0, "all workers succeeded", {}, {}};
        out_.log.push_back("job succeeded");
      } else if (auto* spare = std::get_if<rdzv::KeepAsSpare>(&action)) {
        // Its place in the running round; a/job's spares change, which wakes it to read it.
        PutRank(spare->node_id, {doc_.ranks_token, spare->round, true, 0,
                                 static_cast<int>(doc_.state.members.size()), 0});
      } else if (auto* refuse = std::get_if<rdzv::RefuseJoin>(&action)) {
        auto n = nodes_.find(refuse->node_id);
        const std::int64_t lease = n == nodes_.end() ? 0 : n->second.kv->lease;
        out_.ops.push_back({Op::Kind::kPut, keys_.refusal(refuse->node_id), refuse->reason, lease});
        out_.log.push_back("refused node '" + refuse->node_id + "': " + refuse->reason);
      }
    }
  }

  void FormRound(const rdzv::FormRound& round) {
    doc_.world_size = round.assignments.empty() ? 0 : round.assignments.front().world_size;
    json history = {{"round", round.round},
                    {"restart_count", round.restart_count},
                    {"formed_unix_ms", ToWall(now_, now_, wall_)},
                    {"world_size", doc_.world_size},
                    {"gathering", doc_.gathering}};
    for (const auto& a : round.assignments) history["nodes"].push_back(a.node_id);
    history["spares"] = round.spares;
    RankRecords(round, history);
    out_.ops.push_back({Op::Kind::kPut, keys_.round(round.round), history.dump(), 0});
    // The history keeps the last kRoundsKept rounds; the stores of earlier rounds are gone
    // (kMaxTidied of each a round: a run of an older crun may have hundreds).
    auto rounds = Children(mirror_, keys_.rounds());
    std::erase_if(rounds, [&](const auto& r) { return r.second->key == keys_.round(round.round); });
    for (std::size_t i = 0; i + (kRoundsKept - 1) < rounds.size() && i < kMaxTidied; ++i) {
      out_.ops.push_back({Op::Kind::kDelete, rounds[i].second->key, "", 0});
    }
    std::size_t stores = 0;
    for (const auto& [name, kv] : Children(mirror_, keys_.stores())) {
      if (name != std::to_string(round.round) && stores++ < kMaxTidied) {
        out_.ops.push_back({Op::Kind::kDelete, kv->key, "", 0});
      }
    }
    out_.log.push_back("round " + std::to_string(round.round) +
                       " formed: " + std::to_string(round.assignments.size()) + " nodes, " +
                       std::to_string(doc_.world_size) + " workers, restart count " +
                       std::to_string(round.restart_count));
  }

  // Every node's place in the round, named by a token of the decision's content (two deciders'
  // different rounds cannot share one), each record bound to its node's lease.
  void RankRecords(const rdzv::FormRound& round, const json& history) {
    std::string content = history.dump();
    for (const auto& a : round.assignments) {
      content += "|" + a.node_id + ":" + std::to_string(a.base_rank);
    }
    content += "|job " + std::to_string(doc_.job) + " gathering " + std::to_string(doc_.gathering);
    char token[24];
    std::snprintf(token, sizeof token, "%016zx", std::hash<std::string>{}(content));
    doc_.ranks_token = token;
    out_.rank_ops.clear();  // an earlier round of this same decision is not announced
    for (const auto& a : round.assignments) {
      PutRank(a.node_id, {doc_.ranks_token, round.round, false, a.group_rank, a.group_world_size,
                          a.base_rank});
    }
    const int nodes = static_cast<int>(round.assignments.size());
    for (const auto& id : round.spares) {
      PutRank(id, {doc_.ranks_token, round.round, true, 0, nodes, 0});
    }
  }

  // A node's ranks/ record, bound to its lease.
  void PutRank(const std::string& id, const RankRecord& r) {
    auto n = nodes_.find(id);
    const std::int64_t lease = n == nodes_.end() ? 0 : n->second.kv->lease;
    out_.rank_ops.push_back({Op::Kind::kPut, keys_.rank(id), EncodeRank(r), lease});
  }

  void FailJob(const rdzv::FailJob& fail) {
    Outcome o;
    o.reason = fail.reason;
    if (root_node_) {  // the failure that decided, this time
      o.root_node_id = *root_node_;
      o.root_report_json = root_report_.report_json;
    }
    o.exit_code =
        rdzv::FailedJobExitCode(fail, root_node_ ? std::optional<int>(root_report_.exit_code)
                                                 : std::nullopt);
    doc_.last_failure = fail.reason;
    doc_.outcome = std::move(o);
    out_.log.push_back("job failed: " + fail.reason);
  }

  // A job with an outcome binds every key of its run to one lease of Retention.ttl, once
  // granted (false: ask for it, the decision binds nothing); keys put unbound later (a late
  // report, a/job rewritten) are bound at the next pass.
  bool Retain() {
    if (!doc_.outcome || retention_.ttl.count() <= 0) return true;
    if (doc_.retention_lease == 0) {
      if (retention_.lease == 0) {
        out_ = Decision{};
        out_.needs_lease = true;
        return false;
      }
      doc_.retention_lease = retention_.lease;
      // Every node's report of the last gathering is read: gone, rather than bound one by one.
      out_.ops.push_back({Op::Kind::kDeletePrefix, keys_.reports(), "", 0});
      out_.log.push_back("the job's keys are kept for " + std::to_string(retention_.ttl.count()) +
                         " s (etcd_retention), bound to lease " + std::to_string(retention_.lease));
    }
    return true;
  }

  // Every put of the decider's, and every unbound key of the run, bound to the retention lease
  // (kMaxTidied a pass; the next pass comes at once for the rest).
  void BindToRetention(std::vector<Op>& ops) {
    const std::int64_t lease = doc_.retention_lease;
    std::set<std::string> touched{keys_.state(), keys_.job()};
    std::vector<std::string> gone;
    std::size_t bound = 0;
    for (auto& op : ops) {
      if (op.kind == Op::Kind::kPut && op.lease == 0) op.lease = lease;
      if (op.kind == Op::Kind::kDeletePrefix) gone.push_back(op.key);
      touched.insert(op.key);
    }
    for (auto it = mirror_.lower_bound(keys_.prefix);
         it != mirror_.end() && it->first.starts_with(keys_.prefix); ++it) {
      const KeyValue& kv = it->second;
      if (kv.lease != 0 || touched.count(kv.key) != 0) continue;
      if (std::any_of(gone.begin(), gone.end(),
                      [&](const std::string& g) { return kv.key.starts_with(g); })) {
        continue;
      }
      if (++bound > kMaxTidied) {
        out_.wake_at = now_;
        break;
      }
      ops.push_back({Op::Kind::kPut, kv.key, kv.value, lease});
    }
  }

  // The job for the decider (state) and, when what they act on changed, for the others (job).
  void Write() {
    if (mirror_.count(keys_.layout()) == 0) {
      out_.ops.push_back({Op::Kind::kPut, keys_.layout(), kLayout, 0});
    }
    out_.wake_at = Earliest(doc_.state);
    out_.job_json = EncodeJob(doc_, now_, wall_);
    std::string pub = EncodePublicJob(doc_, now_, wall_);
    auto pub_kv = mirror_.find(keys_.job());
    const std::int64_t lease = doc_.retention_lease;
    out_.job_lease = lease;
    if (pub_kv == mirror_.end() || pub_kv->second.value != pub || pub_kv->second.lease != lease) {
      out_.ops.push_back({Op::Kind::kPut, keys_.job(), std::move(pub), 0});
    }
    if (lease != 0) BindToRetention(out_.ops);
    auto state_kv = mirror_.find(keys_.state());
    const bool state_bound = state_kv != mirror_.end() && state_kv->second.lease == lease;
    out_.write = out_.job_json != before_ || !out_.ops.empty() || !state_bound;
    if (!out_.write) out_.ops.clear();
  }

  const Keys& keys_;
  const Mirror& mirror_;
  const TimePoint now_;
  const WallClock::time_point wall_;
  const Retention retention_;
  Decision out_;
  std::map<std::string, NodeEntry> nodes_;
  JobDoc doc_;
  std::string before_;  // the job as read, encoded: unchanged means nothing to write
  std::optional<std::string> root_node_;
  Report root_report_;
};

}  // namespace

Decision Decide(const Keys& keys, const Mirror& mirror, TimePoint now, WallClock::time_point wall,
                const Retention& retention) {
  return Deciding(keys, mirror, now, wall, retention).Run();
}

StatusOr<rdzv::msg::JobStatus> StatusOf(const Keys& keys, const std::string& run_id,
                                        const Mirror& mirror, TimePoint now,
                                        WallClock::time_point wall) {
  auto job_kv = mirror.find(keys.state());
  if (job_kv == mirror.end()) return NotFound("no job '" + run_id + "' under " + keys.prefix);
  CRUN_ASSIGN_OR_RETURN(JobDoc doc, DecodeJob(job_kv->second.value, now, wall));
  rdzv::msg::JobStatus status =
      rdzv::DescribeJob(run_id, doc.state, doc.world_size, doc.last_failure, now);
  // The decider's verdicts on the running round's ranks (stragglers.h); unreadable ones, none.
  if (auto kv = mirror.find(StragglersKey(keys)); kv != mirror.end()) {
    if (auto verdicts = DecodeVerdicts(kv->second.value); verdicts.ok()) {
      auto named = NamedByNode(*verdicts, doc);
      for (auto& n : status.nodes) {
        if (auto it = named.find(n.node_id); it != named.end()) n.stragglers = it->second;
      }
    }
  }
  return status;
}

}  // namespace crun::etcd
