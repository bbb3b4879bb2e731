// The etcd rendezvous's values as JSON (job.h): node, join, rank, round, report and
// unhealthy records and the job document, encoded and decoded. The decisions on them: job.cc.
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "rendezvous/etcd/job.h"

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

}  // namespace

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
            {"previous", s.previous},
            {"lost",
             std::vector<std::string>(s.lost_hosts.begin() + static_cast<std::ptrdiff_t>(lost_from),
                                      s.lost_hosts.end())},
            {"restarts_used", s.restarts_used},
            {"round_times_ms", std::move(times)},
            {"paid_round", s.paid_round},
            {"crash_loop",
             {{"way", s.crash_loop.way},
              {"attempts", s.crash_loop.attempts},
              {"repeats", s.crash_loop.repeats}}},
            {"unhealthy", std::move(unhealthy)},
            {"unhealthy_reports", s.unhealthy_reports},
            {"stop",
             {{"reason", d.stop_reason},
              {"spends_restart", d.stop_spends_restart},
              {"kind", d.stop_kind},
              {"fault_ms", d.stop_fault_ms}}},
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
    s.previous = j.value("previous", std::vector<std::string>{});
    s.previous_awaited = {s.previous.begin(), s.previous.end()};
    for (const auto& n : s.joined) s.previous_awaited.erase(n.node_id);
    s.lost_hosts = j.at("lost").get<std::vector<std::string>>();
    s.restarts_used = j.at("restarts_used").get<int>();
    for (const auto& t : j.at("round_times_ms")) {
      s.round_times.push_back(FromWall(t.get<std::int64_t>(), now, wall));
    }
    s.paid_round = j.value("paid_round", false);  // absent from documents before it
    if (const auto loop = j.find("crash_loop"); loop != j.end()) {  // as paid_round
      s.crash_loop = {loop->at("way").get<std::string>(), loop->at("attempts").get<int>(),
                      loop->value("repeats", 0)};  // absent from documents before it
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
    d.stop_kind = j.at("stop").value("kind", std::string());
    d.stop_fault_ms = j.at("stop").value("fault_ms", std::int64_t{0});
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

}  // namespace crun::etcd
