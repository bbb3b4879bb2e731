#include "rendezvous/service/engine.h"

#include <algorithm>

namespace crun::rdzv {

struct Engine::Job {
  std::string run_id;
  State state;
  std::optional<TimePoint> wake;
  std::unordered_map<std::string, SessionId> sessions;          // node id -> its live session
  std::unordered_map<std::string, std::uint64_t> incarnations;  // node id -> its agent's
  std::unordered_map<std::string, std::string> dialed;          // node id -> host it dialed
  // node id -> the addresses its workers may reach the store from (its session's, declared)
  std::unordered_map<std::string, std::vector<std::string>> addresses;
  std::unordered_map<std::string, int> group_ranks;  // of the last round formed
  int world_size = 0;
  std::unique_ptr<RoundStore> store;
  std::optional<v1::FailureReport> root_cause;  // the failure that ended the job or its round
  std::string last_failure;
  std::uint64_t finished = 0;  // 0 while running; else its order of finishing
};

namespace {

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kGathering:
      return "gathering";
    case Phase::kRunning:
      return "running";
    case Phase::kFailed:
      return "failed";
    case Phase::kSucceeded:
      return "succeeded";
  }
  return "?";
}

bool Ended(Phase p) { return p == Phase::kFailed || p == Phase::kSucceeded; }

}  // namespace

Settings FromProto(const v1::Settings& s) {
  Settings out;
  out.min_nodes = s.min_nodes();
  out.max_nodes = s.max_nodes();
  if (s.join_timeout_ms() != 0) out.join_timeout = Millis(s.join_timeout_ms());
  if (s.last_call_timeout_ms() != 0) out.last_call_timeout = Millis(s.last_call_timeout_ms());
  if (s.heartbeat_timeout_ms() != 0) out.heartbeat_timeout = Millis(s.heartbeat_timeout_ms());
  out.max_restarts = s.max_restarts();
  return out;
}

int ExitCodeOf(const v1::FailureReport& report) {
  if (report.failures_size() == 0) return 1;
  const auto& f = report.failures(0);
  if (f.exit_case() == v1::WorkerFailure::kSignal) return 128 + f.signal();
  return f.exit_code() != 0 ? f.exit_code() : 1;
}

std::string Describe(const v1::FailureReport& report) {
  if (report.failures_size() == 0) return "a worker on " + report.host() + " failed";
  const auto& f = report.failures(0);
  std::string how = f.exit_case() == v1::WorkerFailure::kSignal
                        ? "signal " + std::to_string(f.signal())
                        : "exit code " + std::to_string(f.exit_code());
  std::string out = "rank " + std::to_string(f.rank()) + " (local rank " +
                    std::to_string(f.local_rank()) + ") on " + report.host() + " failed with " +
                    how;
  if (!f.message().empty()) out += ": " + f.message();
  return out;
}

Engine::Engine(EngineHooks hooks, EngineOptions options)
    : hooks_(std::move(hooks)), options_(std::move(options)) {}

Engine::~Engine() = default;

void Engine::OnMessage(SessionId session, const v1::AgentMessage& m, TimePoint now,
                       const std::string& peer_ip) {
  switch (m.kind_case()) {
    case v1::AgentMessage::kJoin:
      return OnJoin(session, m.join(), now, peer_ip);
    case v1::AgentMessage::kWorkersFailed:
      return OnWorkersFailed(session, m.workers_failed(), now);
    case v1::AgentMessage::kLeave:
      return Unbind(session, now);
    case v1::AgentMessage::kHeartbeat:
    case v1::AgentMessage::kWorkersSucceeded: {
      auto b = bound_.find(session);
      if (b == bound_.end()) return;
      auto& job = *jobs_.at(b->second.run_id);
      const std::string node = b->second.node_id;
      if (m.kind_case() == v1::AgentMessage::kHeartbeat) {
        return Apply(job, rdzv::OnHeartbeat(std::move(job.state), node, now));
      }
      return Apply(job, OnNodeSucceeded(std::move(job.state), node, now));
    }
    case v1::AgentMessage::KIND_NOT_SET:
      return;
  }
}

void Engine::Log(const std::string& line) const {
  if (hooks_.log) hooks_.log(line);
}

void Engine::Refuse(SessionId session, const std::string& reason) {
  Log("refused a join: " + reason);
  v1::ServiceMessage m;
  m.mutable_refused()->set_reason(reason);
  hooks_.send(session, m);
}

Engine::Job& Engine::JobFor(const std::string& run_id, const Settings& settings) {
  auto it = jobs_.find(run_id);
  // An ended job with nobody left is history: the same run id starts afresh.
  if (it != jobs_.end() && !(it->second->finished != 0 && it->second->sessions.empty())) {
    return *it->second;
  }
  auto job = std::make_unique<Job>();
  job->run_id = run_id;
  job->state.settings = settings;
  auto& ref = *job;
  jobs_[run_id] = std::move(job);
  return ref;
}

void Engine::OnJoin(SessionId session, const v1::Join& join, TimePoint now,
                    const std::string& peer_ip) {
  if (join.protocol_version() != kProtocolVersion) {
    return Refuse(session, "protocol version " + std::to_string(join.protocol_version()) +
                               " is not supported: this service speaks version " +
                               std::to_string(kProtocolVersion));
  }
  if (join.run_id().empty()) return Refuse(session, "the join names no run id");
  const auto& node = join.node();
  if (node.node_id().empty()) return Refuse(session, "the join names no node id");
  const Settings settings = FromProto(join.settings());
  if (auto v = settings.Validate(); !v.ok()) return Refuse(session, v.message());

  if (auto b = bound_.find(session); b != bound_.end()) {
    // A re-join after "stop and re-join": the same run and node, on the same session.
    if (b->second.run_id != join.run_id() || b->second.node_id != node.node_id()) {
      return Refuse(session, "this session already joined run '" + b->second.run_id +
                                 "' as node '" + b->second.node_id + "'");
    }
    auto& bound_job = *jobs_.at(b->second.run_id);
    if (bound_job.state.phase == Phase::kGathering &&
        bound_job.state.present.count(node.node_id()) != 0) {
      return;  // joined already: nothing to do
    }
  }
  Job& job = JobFor(join.run_id(), settings);
  if (auto owner = job.sessions.find(node.node_id());
      owner != job.sessions.end() && owner->second != session && node.incarnation() != 0 &&
      job.incarnations[node.node_id()] == node.incarnation()) {
    // The same agent on a new session: its old one broke (a stopped service, a cut link) and
    // this side has not noticed yet. The old session is let go as the node's loss (a running
    // round re-forms), then the join proceeds as a fresh one.
    Log(job.run_id + ": node '" + node.node_id() + "' is back on a new session");
    Unbind(owner->second, now, "it came back on a new session");
  }
  if (auto owner = job.sessions.find(node.node_id());
      owner != job.sessions.end() && owner->second != session) {
    Refuse(session, "another agent already joined run '" + join.run_id() + "' as node '" +
                        node.node_id() + "' (give each agent its own node id)");
    if (job.state.phase == Phase::kGathering && job.state.round < 0) {
      // Two agents claim one identity before the job ever ran: a configuration mistake (one
      // node_id given to several agents) that leaves the job a node short. The agents already
      // waiting are told now, not at their join timeout.
      job.state.phase = Phase::kFailed;
      Finish(job, false,
             "a second agent (on host " + node.host() + ") asked to join as node '" +
                 node.node_id() +
                 "', which another agent holds: give each agent "
                 "its own --rdzv-conf node_id, or leave it unset (one per crun)");
    }
    return;
  }
  NodeDescription desc;
  desc.node_id = node.node_id();
  desc.host = node.host();
  desc.nproc = node.nproc();
  if (node.has_requested_rank()) desc.requested_rank = node.requested_rank();
  Transition t = rdzv::OnJoin(std::move(job.state), desc, settings, now);
  for (const auto& a : t.actions) {
    if (const auto* r = std::get_if<RefuseJoin>(&a); r != nullptr && r->node_id == desc.node_id) {
      job.state = std::move(t.state);
      return Refuse(session, r->reason);
    }
  }
  bound_[session] = Binding{job.run_id, desc.node_id};
  job.sessions[desc.node_id] = session;
  job.incarnations[desc.node_id] = node.incarnation();
  job.dialed[desc.node_id] = join.service_host();
  auto& addresses = job.addresses[desc.node_id];
  addresses.clear();
  if (!peer_ip.empty()) addresses.push_back(peer_ip);
  for (const auto& a : node.addresses()) addresses.push_back(a);
  Apply(job, std::move(t));
}

void Engine::OnWorkersFailed(SessionId session, const v1::FailureReport& report, TimePoint now) {
  auto b = bound_.find(session);
  if (b == bound_.end()) return;
  auto& job = *jobs_.at(b->second.run_id);
  const std::string node = b->second.node_id;
  // Only the first failure of a running round decides; later ones are its consequences.
  if (job.state.phase == Phase::kRunning && job.state.member_index.count(node) != 0) {
    job.root_cause = report;
    job.root_cause->set_node_id(node);
    job.last_failure = Describe(report);
  }
  Apply(job, rdzv::OnWorkerFailed(std::move(job.state), node, Describe(report), now));
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
  Apply(job, OnNodeLost(std::move(job.state), binding.node_id, now, cause));
}

void Engine::OnSessionClosed(SessionId session, TimePoint now) { Unbind(session, now); }

void Engine::OnTick(TimePoint now) {
  for (auto& [id, job] : jobs_) {
    if (job->wake && *job->wake <= now) {
      job->wake.reset();
      Apply(*job, rdzv::OnTick(std::move(job->state), now));
    }
  }
}

std::optional<TimePoint> Engine::NextWake() const {
  std::optional<TimePoint> next;
  for (const auto& [id, job] : jobs_) {
    if (job->wake && (!next || *job->wake < *next)) next = job->wake;
  }
  return next;
}

void Engine::SendToJob(const Job& job, const v1::ServiceMessage& m) {
  for (const auto& [node, session] : job.sessions) hooks_.send(session, m);
}

void Engine::Finish(Job& job, bool success, const std::string& reason) {
  job.finished = ++finish_sequence_;
  job.wake.reset();
  job.store.reset();
  v1::ServiceMessage m;
  auto* f = m.mutable_finished();
  f->set_success(success);
  f->set_reason(reason);
  if (!success && job.root_cause) {
    *f->mutable_root_cause() = *job.root_cause;
    f->set_exit_code(ExitCodeOf(*job.root_cause));
  } else {
    f->set_exit_code(success ? 0 : 1);
  }
  if (!success) job.last_failure = reason;
  Log(job.run_id + ": job " + (success ? "succeeded" : "failed: " + reason));
  SendToJob(job, m);
  EvictFinished();
}

void Engine::Apply(Job& job, Transition t) {
  job.state = std::move(t.state);
  if (t.wake_at) job.wake = t.wake_at;
  if (Ended(job.state.phase)) job.wake.reset();
  for (auto& action : t.actions) {
    if (auto* round = std::get_if<FormRound>(&action)) {
      job.store.reset();
      std::vector<std::string> allowed;
      for (const auto& a : round->assignments) {
        auto known = job.addresses.find(a.node_id);
        if (known == job.addresses.end() || known->second.empty()) {
          allowed.clear();  // a member of unknown address: no list rather than a wrong one
          break;
        }
        allowed.insert(allowed.end(), known->second.begin(), known->second.end());
      }
      auto store = hooks_.start_store(job.run_id, round->round, allowed);
      if (!store.ok()) {
        job.state.phase = Phase::kFailed;
        job.wake.reset();
        Finish(job, false,
               "cannot start the worker store of round " + std::to_string(round->round) + ": " +
                   store.status().message());
        return;
      }
      job.store = std::move(store).value();
      Log(job.run_id + ": round " + std::to_string(round->round) +
          " formed: " + std::to_string(round->assignments.size()) + " nodes, " +
          std::to_string(round->assignments.empty() ? 0 : round->assignments.front().world_size) +
          " workers, restart " + std::to_string(round->restart_count) + ", store port " +
          std::to_string(job.store->port()) +
          (round->spares.empty() ? "" : ", " + std::to_string(round->spares.size()) + " spares"));
      job.group_ranks.clear();
      job.world_size = round->assignments.empty() ? 0 : round->assignments.front().world_size;
      for (const auto& a : round->assignments) {
        job.group_ranks[a.node_id] = a.group_rank;
        auto session = job.sessions.find(a.node_id);
        if (session == job.sessions.end()) continue;  // cannot happen: members are bound
        v1::ServiceMessage m;
        auto* r = m.mutable_assignment();
        r->set_round(round->round);
        r->set_group_rank(a.group_rank);
        r->set_group_world_size(a.group_world_size);
        r->set_base_rank(a.base_rank);
        r->set_world_size(a.world_size);
        r->set_master_addr(options_.advertise_addr.empty() ? job.dialed[a.node_id]
                                                           : options_.advertise_addr);
        r->set_master_port(job.store->port());
        r->set_restart_count(round->restart_count);
        r->set_durable_service(options_.durable);
        hooks_.send(session->second, m);
      }
      for (const auto& spare : round->spares) {
        auto session = job.sessions.find(spare);
        if (session == job.sessions.end()) continue;
        v1::ServiceMessage m;
        m.mutable_assignment()->set_round(round->round);
        m.mutable_assignment()->set_spare(true);
        m.mutable_assignment()->set_restart_count(round->restart_count);
        m.mutable_assignment()->set_durable_service(options_.durable);
        hooks_.send(session->second, m);
      }
    } else if (auto* stop = std::get_if<StopAndRejoin>(&action)) {
      Log(job.run_id + ": stop and re-join: " + stop->reason);
      v1::ServiceMessage m;
      m.mutable_stop_and_rejoin()->set_reason(stop->reason);
      m.mutable_stop_and_rejoin()->set_spends_restart(stop->spends_restart);
      for (const auto& [node, session] : job.sessions) {
        // A node that caused the new gathering by joining it is in it already.
        if (job.state.present.count(node) == 0) hooks_.send(session, m);
      }
    } else if (auto* fail = std::get_if<FailJob>(&action)) {
      Finish(job, false, fail->reason);
    } else if (std::get_if<SucceedJob>(&action) != nullptr) {
      Finish(job, true, "all workers succeeded");
    }
    // RefuseJoin is answered by OnJoin, which knows the session.
  }
}

void Engine::EvictFinished() {
  std::vector<std::pair<std::uint64_t, std::string>> ended;
  for (const auto& [id, job] : jobs_) {
    if (job->finished != 0 && job->sessions.empty()) ended.emplace_back(job->finished, id);
  }
  if (ended.size() <= options_.keep_finished_jobs) return;
  std::sort(ended.begin(), ended.end());
  for (std::size_t i = 0; i + options_.keep_finished_jobs < ended.size(); ++i) {
    jobs_.erase(ended[i].second);
  }
}

v1::StatusResponse Engine::Status(const std::string& run_id, TimePoint now) const {
  v1::StatusResponse out;
  auto age_ms = [&](TimePoint t) { return std::chrono::duration_cast<Millis>(now - t).count(); };
  for (const auto& [id, job] : jobs_) {
    if (!run_id.empty() && id != run_id) continue;
    const State& s = job->state;
    auto* j = out.add_jobs();
    j->set_run_id(id);
    j->set_phase(PhaseName(s.phase));
    j->set_round(s.round);
    j->set_restarts_used(s.restarts_used);
    j->set_max_restarts(s.settings.max_restarts);
    j->set_min_nodes(s.settings.min_nodes);
    j->set_max_nodes(s.settings.max_nodes);
    j->set_world_size(job->world_size);
    j->set_last_failure(job->last_failure);
    for (const auto& h : s.lost_hosts) j->add_lost_hosts(h);
    auto add = [&](const NodeDescription& n, const char* state, int rank) {
      auto* ns = j->add_nodes();
      ns->set_node_id(n.node_id);
      ns->set_host(n.host);
      ns->set_state(state);
      ns->set_group_rank(rank);
      ns->set_nproc(n.nproc);
      return ns;
    };
    for (const auto& m : s.members) {
      auto rank = job->group_ranks.find(m.node.node_id);
      auto* ns = add(m.node, m.succeeded ? "succeeded" : "member",
                     rank == job->group_ranks.end() ? -1 : rank->second);
      ns->set_last_heartbeat_ms_ago(age_ms(m.last_heartbeat));
    }
    for (const auto& n : s.spares) add(n, "spare", -1);
    for (const auto& n : s.joined) add(n, "joined", -1);
  }
  return out;
}

}  // namespace crun::rdzv
