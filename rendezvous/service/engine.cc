// The engine (engine.h): messages in, sessions bound and unbound, rounds started and their
// assignments sent, jobs finished, and what is said of them. Joins: engine_joins.cc; `crun
// stacks`: engine_stacks.cc; the job's state they share: engine_job.h.
#include "rendezvous/service/engine.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rendezvous/goodput/ledger_json.h"
#include "rendezvous/service/engine_job.h"

namespace crun::rdzv {

Engine::Engine(EngineHooks hooks, EngineOptions options)
    : hooks_(std::move(hooks)), options_(std::move(options)) {}

Engine::~Engine() = default;

void Engine::OnMessage(SessionId session, const msg::AgentMessage& m, TimePoint now,
                       const std::string& peer_ip) {
  if (const auto* join = std::get_if<msg::Join>(&m)) return OnJoin(session, *join, now, peer_ip);
  if (const auto* report = std::get_if<msg::FailureReport>(&m)) {
    return OnWorkersFailed(session, *report, now);
  }
  if (const auto* leave = std::get_if<msg::Leave>(&m)) {
    // Its reason is the others' (a node excluded for a slow rank, crun stopped by a signal).
    return Unbind(session, now,
                  leave->reason.empty() ? "its session ended" : "it left: " + leave->reason);
  }
  if (const auto* reply = std::get_if<msg::StacksReply>(&m)) return OnStacksReply(session, *reply);
  if (const auto* ledger = std::get_if<msg::Goodput>(&m)) {
    auto b = bound_.find(session);
    if (b == bound_.end()) return;
    auto& job = *jobs_.at(b->second.run_id);
    if (auto s = job.goodput.Received(b->second.node_id, ledger->ledger_json, now); !s.ok()) {
      Log(job.run_id + ": goodput ledger ignored: " + s.message());
    }
    return;
  }
  if (const auto* wanted = std::get_if<msg::StacksWanted>(&m)) {
    auto b = bound_.find(session);
    if (b == bound_.end()) return;
    StacksAsk ask;
    ask.run_id = b->second.run_id;
    ask.requester = session;
    ask.result.request_id = wanted->request_id;
    auto asked =
        FanOutStacks(std::move(ask), wanted->reason, session, Millis(wanted->timeout_ms), now);
    if (!asked.ok()) {
      msg::StacksResult none;
      none.request_id = wanted->request_id;
      none.run_id = b->second.run_id;
      none.missing.push_back(asked.status().message());
      hooks_.send(session, none);
    }
    return;
  }
  auto b = bound_.find(session);  // a heartbeat, or the node's workers succeeded
  if (b == bound_.end()) return;
  auto& job = *jobs_.at(b->second.run_id);
  const std::string node = b->second.node_id;
  if (const auto* beat = std::get_if<msg::Heartbeat>(&m)) {
    if (job.series.heartbeats != nullptr) job.series.heartbeats->Inc();
    job.snapshots[node] = beat->snapshots;
    if (!beat->compute.empty()) JudgeStragglers(job, node, *beat);
    return Apply(job, rdzv::OnHeartbeat(std::move(job.state), node, now), now);
  }
  Apply(job, OnNodeSucceeded(std::move(job.state), node, now), now);
}

void Engine::Log(const std::string& line) const {
  if (hooks_.log) hooks_.log(line);
}

void Engine::Refuse(SessionId session, const char* code, const std::string& reason) {
  Log("refused a join: " + reason);
  if (options_.metrics != nullptr) options_.metrics->Refused(code);
  hooks_.send(session, msg::Refused{reason});
}

Engine::Job& Engine::JobFor(const std::string& run_id, const Settings& settings, TimePoint now) {
  auto it = jobs_.find(run_id);
  // An ended job with nobody left is history: the same run id starts afresh.
  if (it != jobs_.end() && !(it->second->finished != 0 && it->second->sessions.empty())) {
    return *it->second;
  }
  if (it != jobs_.end()) Forget(run_id);
  auto job = std::make_unique<Job>();
  job->run_id = run_id;
  job->state.settings = settings;
  job->gathering_since = now;
  if (options_.metrics != nullptr) job->series = options_.metrics->ForJob(run_id);
  auto& ref = *job;
  jobs_[run_id] = std::move(job);
  return ref;
}

void Engine::Forget(const std::string& run_id) {
  if (options_.metrics != nullptr) options_.metrics->Forget(run_id);
}

void Engine::OnWorkersFailed(SessionId session, const msg::FailureReport& report, TimePoint now) {
  auto b = bound_.find(session);
  if (b == bound_.end()) return;
  auto& job = *jobs_.at(b->second.run_id);
  const std::string node = b->second.node_id;
  // Only the first failure of a running round decides; later ones are its consequences.
  if (job.state.phase == Phase::kRunning && job.state.member_index.count(node) != 0) {
    job.root_cause = report;
    job.root_cause->node_id = node;
    job.last_failure = Describe(report);
    if (options_.metrics != nullptr) options_.metrics->Failure(job.run_id, FailureCause(report));
  }
  Apply(job, rdzv::OnWorkerFailed(std::move(job.state), node, rdzv::FailureOf(report), now), now);
}

void Engine::Unbind(SessionId session, TimePoint now, const std::string& cause) {
  auto b = bound_.find(session);
  if (b == bound_.end()) return;
  const Binding binding = b->second;
  bound_.erase(b);
  auto& job = *jobs_.at(binding.run_id);
  job.sessions.erase(binding.node_id);
  if (job.finished != 0) {
    EvictFinished();
    return;
  }
  if (options_.metrics != nullptr && job.state.phase == Phase::kRunning) {
    auto m = job.state.member_index.find(binding.node_id);
    if (m != job.state.member_index.end() && !job.state.members[m->second].succeeded) {
      options_.metrics->Failure(job.run_id, kCauseNodeLost);
    }
  }
  Apply(job, OnNodeLost(std::move(job.state), binding.node_id, now, cause), now);
}

void Engine::OnSessionClosed(SessionId session, TimePoint now) {
  // Its part in stacks requests: a node that can no longer answer, an asker gone.
  std::vector<std::uint64_t> complete;
  for (auto it = asks_.begin(); it != asks_.end();) {
    auto& ask = it->second;
    if (ask.requester == session) {
      it = asks_.erase(it);
      continue;
    }
    if (auto w = ask.waiting.find(session); w != ask.waiting.end()) {
      ask.result.missing.push_back(w->second + " (its session ended)");
      ask.waiting.erase(w);
      if (ask.waiting.empty()) complete.push_back(it->first);
    }
    ++it;
  }
  for (auto id : complete) CompleteStacks(id);
  Unbind(session, now);
}

void Engine::OnTick(TimePoint now) {
  std::vector<std::uint64_t> due;
  for (const auto& [id, ask] : asks_) {
    if (ask.deadline <= now) due.push_back(id);
  }
  for (auto id : due) CompleteStacks(id);
  for (auto& [id, job] : jobs_) {
    if (job->wake && *job->wake <= now) {
      job->wake.reset();
      const bool running = job->state.phase == Phase::kRunning;
      const std::size_t lost = job->state.lost_hosts.size();
      Apply(*job, rdzv::OnTick(std::move(job->state), now), now);
      // A running round loses a node on a tick only when its heartbeats ran out.
      if (options_.metrics != nullptr && running && job->state.lost_hosts.size() > lost) {
        options_.metrics->Failure(job->run_id, kCauseHeartbeat);
      }
    }
  }
}

std::optional<TimePoint> Engine::NextWake() const {
  std::optional<TimePoint> next;
  for (const auto& [id, ask] : asks_) {
    if (!next || ask.deadline < *next) next = ask.deadline;
  }
  for (const auto& [id, job] : jobs_) {
    if (job->wake && (!next || *job->wake < *next)) next = job->wake;
  }
  return next;
}

void Engine::SendToJob(const Job& job, const msg::ServiceMessage& m) {
  for (const auto& [node, session] : job.sessions) hooks_.send(session, m);
}

void Engine::Finish(Job& job, bool success, const std::string& reason, int exit_code) {
  job.finished = ++finish_sequence_;
  job.wake.reset();
  job.store.reset();
  msg::JobFinished f;
  f.success = success;
  f.reason = reason;
  if (!success && job.root_cause) f.root_cause = job.root_cause;
  f.exit_code =
      success ? 0
              : FailedJobExitCode(FailJob{reason, exit_code},
                                  job.root_cause ? std::optional<int>(ExitCodeOf(*job.root_cause))
                                                 : std::nullopt);
  if (!success) job.last_failure = reason;
  // Each node's ledger as it last sent it: every node combines the job's, with its own last.
  for (const auto& n : job.goodput.AsOf(TimePoint{}, {})) {
    f.goodput.push_back(goodput::ToJson(n).dump());
  }
  Log(job.run_id + ": job " + (success ? "succeeded" : "failed: " + reason));
  if (options_.metrics != nullptr) options_.metrics->Finished(success);
  SendToJob(job, f);
  EvictFinished();
}

void Engine::Apply(Job& job, Transition t, TimePoint now) {
  job.state = std::move(t.state);
  if (t.wake_at) job.wake = t.wake_at;
  if (Ended(job.state.phase)) job.wake.reset();
  for (auto& action : t.actions) {
    if (auto* round = std::get_if<FormRound>(&action)) {
      if (!StartRound(job, *round, now)) return;
      SendAssignments(job, *round);
    } else if (auto* stop = std::get_if<StopAndRejoin>(&action)) {
      Log(job.run_id + ": stop and re-join: " + stop->reason);
      job.gathering_since = now;
      const msg::ServiceMessage m = msg::StopAndRejoin{stop->reason, stop->spends_restart,
                                                       stop->kind, stop->fault_ago.count()};
      for (const auto& [node, session] : job.sessions) {
        // A node that caused the new gathering by joining it is in it already.
        if (job.state.present.count(node) == 0) hooks_.send(session, m);
      }
    } else if (auto* fail = std::get_if<FailJob>(&action)) {
      Finish(job, false, fail->reason, fail->exit_code);
    } else if (std::get_if<SucceedJob>(&action) != nullptr) {
      Finish(job, true, "all workers succeeded");
    } else if (auto* spare = std::get_if<KeepAsSpare>(&action)) {
      if (auto session = job.sessions.find(spare->node_id); session != job.sessions.end()) {
        hooks_.send(session->second, SpareAssignment(spare->round, spare->restart_count));
      }
    }
    // RefuseJoin is answered by OnJoin, which knows the session.
  }
}

void Engine::JudgeStragglers(Job& job, const std::string& node, const msg::Heartbeat& beat) {
  // Figures of an earlier round (sent before its stop reached the node) are not this one's.
  if (job.state.phase != Phase::kRunning || beat.compute_round != job.state.round) return;
  msg::Stragglers out{job.state.round, {}};
  for (const auto& figure : beat.compute) {
    // A node speaks for its own ranks only: a figure of another node's rank (an agent that has
    // not seen the new round's ranks yet) or of no rank of the round is dropped.
    if (figure.rank < 0 || figure.rank >= job.world_size) continue;
    const std::string* sender = job.rank_owners.Of(figure.rank);
    if (sender == nullptr || *sender != node) continue;
    for (const auto& change : OnComputeSample(job.stragglers, figure, options_.stragglers)) {
      const std::string* owner = job.rank_owners.Of(change.rank);
      const std::string& owner_id = owner == nullptr ? node : *owner;
      auto& named = job.slow[owner_id];
      named.erase(std::remove_if(named.begin(), named.end(),
                                 [&](const StragglerChange& c) { return c.rank == change.rank; }),
                  named.end());
      if (change.named) {
        named.push_back(change);
        if (options_.metrics != nullptr) options_.metrics->StragglerNamed(job.run_id);
      }
      const auto m = job.state.member_index.find(owner_id);
      const std::string host =
          m == job.state.member_index.end() ? owner_id : job.state.members[m->second].node.host;
      Log(job.run_id + ": " + (change.named ? "slow rank on " : "no longer slow, on ") + host +
          ": " + DescribeStraggler(change));
      out.changes.push_back({change, host});
    }
  }
  if (out.changes.empty()) return;
  for (const auto& [id, session] : job.sessions) hooks_.send(session, out);
}

bool Engine::StartRound(Job& job, const FormRound& round, TimePoint now) {
  job.store.reset();
  std::vector<std::vector<std::string>> addresses;
  for (const auto& a : round.assignments) {
    auto known = job.addresses.find(a.node_id);
    addresses.push_back(known == job.addresses.end() ? std::vector<std::string>{} : known->second);
  }
  const int world = round.assignments.empty() ? 0 : round.assignments.front().world_size;
  auto store = hooks_.start_store(job.run_id, round.round, world, addresses);
  if (!store.ok()) {
    job.state.phase = Phase::kFailed;
    job.wake.reset();
    Finish(job, false,
           "cannot start the worker store of round " + std::to_string(round.round) + ": " +
               store.status().message());
    return false;
  }
  job.store = std::move(store).value();
  Log(job.run_id + ": round " + std::to_string(round.round) +
      " formed: " + std::to_string(round.assignments.size()) + " nodes, " + std::to_string(world) +
      " workers, restart " + std::to_string(round.restart_count) + ", store port " +
      std::to_string(job.store->port()) +
      (round.spares.empty() ? "" : ", " + std::to_string(round.spares.size()) + " spares"));
  job.world_size = world;
  job.stragglers = StragglerState{};
  job.stragglers.world_size = world;
  job.rank_owners.Clear();
  for (const auto& a : round.assignments) job.rank_owners.Add(a.base_rank, a.node_id);
  job.slow.clear();
  if (options_.metrics != nullptr) {
    options_.metrics->RoundFormed(job.series,
                                  std::chrono::duration<double>(now - job.gathering_since).count());
  }
  return true;
}

void Engine::SendAssignments(Job& job, const FormRound& round) {
  // Every node's address and ports go to every member only where some node reserved ports
  // (--contract): the list is O(nodes) per member, which a job of 10,000 torch nodes must not
  // pay. One list, shared by every member's message and encoded once (Core::Encode).
  std::shared_ptr<std::vector<msg::RoundMember>> members;
  if (std::any_of(job.state.members.begin(), job.state.members.end(),
                  [](const Member& m) { return !m.node.ports.empty(); })) {
    std::unordered_map<std::string_view, const NodeDescription*> by_id;
    for (const auto& m : job.state.members) by_id.emplace(m.node.node_id, &m.node);
    members = std::make_shared<std::vector<msg::RoundMember>>();
    for (const auto& a : round.assignments) {
      const auto it = by_id.find(a.node_id);
      if (it == by_id.end()) continue;  // cannot happen: the round's members
      const NodeDescription& n = *it->second;
      members->push_back({n.host, n.address, n.nproc, n.ports});
    }
  }
  for (const auto& a : round.assignments) {
    auto session = job.sessions.find(a.node_id);
    if (session == job.sessions.end()) continue;  // cannot happen: members are bound
    msg::Assignment m;
    m.members = members;
    m.round = round.round;
    m.group_rank = a.group_rank;
    m.group_world_size = a.group_world_size;
    m.base_rank = a.base_rank;
    m.world_size = a.world_size;
    m.master_addr =
        options_.advertise_addr.empty() ? job.dialed[a.node_id] : options_.advertise_addr;
    m.master_port = job.store->port();
    m.restart_count = round.restart_count;
    m.durable_service = options_.durable;
    m.waited_for_nodes_ms = round.waited_for_nodes.count();
    hooks_.send(session->second, m);
  }
  for (const auto& spare : round.spares) {
    auto session = job.sessions.find(spare);
    if (session == job.sessions.end()) continue;
    hooks_.send(session->second, SpareAssignment(round.round, round.restart_count));
  }
}

msg::Assignment Engine::SpareAssignment(int round, int restart_count) const {
  msg::Assignment m;
  m.round = round;
  m.restart_count = restart_count;
  m.spare = true;
  m.durable_service = options_.durable;
  return m;
}

void Engine::EvictFinished() {
  std::vector<std::pair<std::uint64_t, std::string>> ended;
  for (const auto& [id, job] : jobs_) {
    if (job->finished != 0 && job->sessions.empty()) ended.emplace_back(job->finished, id);
  }
  if (ended.size() <= options_.keep_finished_jobs) return;
  std::sort(ended.begin(), ended.end());
  for (std::size_t i = 0; i + options_.keep_finished_jobs < ended.size(); ++i) {
    Forget(ended[i].second);
    jobs_.erase(ended[i].second);
  }
}

void Engine::RefreshMetrics(TimePoint now) const {
  EngineMetrics* m = options_.metrics;
  if (m == nullptr) return;
  std::map<Phase, int> phases{{Phase::kGathering, 0},
                              {Phase::kRunning, 0},
                              {Phase::kSucceeded, 0},
                              {Phase::kFailed, 0}};
  for (const auto& [id, job] : jobs_) {
    const State& s = job->state;
    ++phases[s.phase];
    const auto& series = job->series;
    if (series.restarts == nullptr) continue;
    series.restarts->Mirror(s.restarts_used);
    series.members->Set(static_cast<double>(s.members.size()));
    series.spares->Set(static_cast<double>(s.spares.size()));
    series.joined->Set(static_cast<double>(s.joined.size()));
    series.world_size->Set(job->world_size);
    if (!job->goodput.empty()) {
      const auto combined = goodput::Combine(job->goodput.AsOf(now, job->LiveLedgers()));
      m->Goodput(id, combined.totals, combined.progress_known);
    }
  }
  for (const auto& [phase, count] : phases) m->jobs.With({PhaseName(phase)}).Set(count);
  m->agents.With().Set(static_cast<double>(bound_.size()));
}

std::vector<goodput::NodeLedger> Engine::Goodput(std::string& run_id, TimePoint now) const {
  if (run_id.empty()) {
    for (const auto& [id, job] : jobs_) {
      if (job->goodput.empty()) continue;
      if (!run_id.empty()) return {};  // more than one: name it
      run_id = id;
    }
  }
  const auto it = jobs_.find(run_id);
  if (it == jobs_.end()) return {};
  return it->second->goodput.AsOf(now, it->second->LiveLedgers());
}

msg::StatusResponse Engine::Status(const std::string& run_id, TimePoint now) const {
  msg::StatusResponse out;
  for (const auto& [id, job] : jobs_) {
    if (!run_id.empty() && id != run_id) continue;
    out.jobs.push_back(DescribeJob(id, job->state, job->world_size, job->last_failure, now));
    DescribeGoodput(job->goodput.AsOf(now, job->LiveLedgers()), out.jobs.back());
    for (auto& n : out.jobs.back().nodes) {
      const auto it = job->snapshots.find(n.node_id);
      if (it != job->snapshots.end()) n.snapshots = it->second;
      if (const auto slow = job->slow.find(n.node_id); slow != job->slow.end()) {
        n.stragglers = slow->second;
      }
    }
  }
  return out;
}

}  // namespace crun::rdzv
