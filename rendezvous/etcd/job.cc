// The etcd rendezvous's decisions on its keys (job.h): the decider's pass (Decide) and what
// `crun status` says of a run (StatusOf). The records' JSON: records.cc.
#include "rendezvous/etcd/job.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <stdexcept>
#include <variant>

#include <nlohmann/json.hpp>

#include "rendezvous/etcd/goodput.h"
#include "rendezvous/etcd/stragglers.h"
#include "rendezvous/service/job_status.h"

namespace crun::etcd {
namespace {

using json = nlohmann::json;
using rdzv::Millis;
using rdzv::Phase;
using rdzv::TimePoint;

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
    // The old job's goodput: the new one's ledgers start over (one a new node put before this
    // decision comes again at its next incident, first training or minute; goodput.h).
    out_.ops.push_back({Op::Kind::kDeletePrefix, LedgerKey(keys_, ""), "", 0});
    out_.ops.push_back({Op::Kind::kDelete, JobGoodputKey(keys_), "", 0});
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
      const auto heartbeat = doc_.state.settings.heartbeat_timeout;
      // Its lease ran out a heartbeat_timeout after its last keep-alive: the fault's time.
      Apply(rdzv::OnNodeLost(std::move(doc_.state), id, now_,
                             "its etcd lease ended (the agent left, died, or was cut off for "
                             "longer than heartbeat_timeout " +
                                 std::to_string(heartbeat.count()) + " ms)",
                             now_ - heartbeat));
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
        doc_.stop_kind = stop->kind;
        doc_.stop_fault_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(wall_.time_since_epoch())
                .count() -
            stop->fault_ago.count();
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
                    {"formed_unix_ms",
                     std::chrono::duration_cast<Millis>(wall_.time_since_epoch()).count()},
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
      // Its value stays in etcd: a node's ledger may be hundreds of KB (goodput.h), and
      // sixteen of them would outgrow a request; and a newer one is not overwritten.
      ops.push_back({Op::Kind::kPut, kv.key, "", lease, /*keep_value=*/true});
    }
  }

  // The job's goodput, combined from the nodes' ledgers as they put them (each just before
  // its report), for every node to read at its end (goodput.h). A value that cannot be read is
  // left out.
  void JobGoodputOp() {
    auto ledgers = Ledgers(keys_, mirror_, std::nullopt);
    if (ledgers.empty()) return;
    const std::size_t nodes = ledgers.size();
    std::string value = EncodeJobGoodput(goodput::Combine(std::move(ledgers)), nodes);
    auto kv = mirror_.find(JobGoodputKey(keys_));
    if (kv == mirror_.end() || kv->second.value != value) {
      out_.ops.push_back({Op::Kind::kPut, JobGoodputKey(keys_), std::move(value), 0});
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
    if (doc_.outcome) JobGoodputOp();
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
  // The ledgers the nodes put (goodput.h), carried on to now for the nodes still there.
  rdzv::DescribeGoodput(Ledgers(keys, mirror, wall), status);
  return status;
}

}  // namespace crun::etcd
