// The engine's joins (engine.h): a join checked, a node's session bound to its job, the rules'
// answer applied; and a node that failed its health gate, counted and named.
#include "rendezvous/service/engine_job.h"

namespace crun::rdzv {
namespace {

const char* RefusalCode(RefuseJoin::Kind kind) {
  switch (kind) {
    case RefuseJoin::Kind::kSettingsMismatch:
      return kRefusedMismatch;
    case RefuseJoin::Kind::kJobEnded:
      return kRefusedEnded;
    case RefuseJoin::Kind::kDuplicateNode:
      return kRefusedDuplicate;
    case RefuseJoin::Kind::kInvalid:
      break;
  }
  return kRefusedBadJoin;
}

}  // namespace

// What a join must say of itself before anything else: the protocol, the run, the node and
// settings the rules accept. False: the session was refused.
bool Engine::WellFormed(SessionId session, const msg::Join& join) {
  if (join.protocol_version != kProtocolVersion) {
    Refuse(session, kRefusedVersion,
           "protocol version " + std::to_string(join.protocol_version) +
               " is not supported: this service speaks version " +
               std::to_string(kProtocolVersion));
    return false;
  }
  std::string bad;
  if (join.run_id.empty()) bad = "the join names no run id";
  if (bad.empty() && join.node.node_id.empty()) bad = "the join names no node id";
  if (auto v = join.settings.Validate(); bad.empty() && !v.ok()) bad = v.message();
  if (bad.empty()) return true;
  Refuse(session, kRefusedBadJoin, bad);
  return false;
}

namespace {

// The node as the rules see it: other nodes' workers reach its workers where it says, else
// where its session came from.
NodeDescription DescriptionOf(const msg::Node& node, const std::string& peer_ip) {
  NodeDescription desc;
  desc.node_id = node.node_id;
  desc.host = node.host;
  desc.nproc = node.nproc;
  desc.requested_rank = node.requested_rank;
  desc.address = !node.addresses.empty() ? node.addresses.front()
                 : !peer_ip.empty()      ? peer_ip
                                         : node.host;
  desc.ports = node.ports;
  return desc;
}

}  // namespace

void Engine::OnJoin(SessionId session, const msg::Join& join, TimePoint now,
                    const std::string& peer_ip) {
  if (!WellFormed(session, join)) return;
  const auto& node = join.node;
  const Settings& settings = join.settings;
  if (!join.unhealthy.empty()) return OnUnhealthy(session, join, now);
  if (auto b = bound_.find(session); b != bound_.end()) {
    // A re-join after "stop and re-join": the same run and node, on the same session.
    if (b->second.run_id != join.run_id || b->second.node_id != node.node_id) {
      return Refuse(session, kRefusedBadJoin,
                    "this session already joined run '" + b->second.run_id + "' as node '" +
                        b->second.node_id + "'");
    }
    auto& bound_job = *jobs_.at(b->second.run_id);
    if (bound_job.state.phase == Phase::kGathering &&
        bound_job.state.present.count(node.node_id) != 0) {
      return;  // joined already: nothing to do
    }
  }
  Job& job = JobFor(join.run_id, settings, now);
  if (auto owner = job.sessions.find(node.node_id);
      owner != job.sessions.end() && owner->second != session && node.incarnation != 0 &&
      job.incarnations[node.node_id] == node.incarnation) {
    // The same agent on a new session: its old one broke (a stopped service, a cut link) and
    // this side has not noticed yet. The old session is let go as the node's loss (a running
    // round re-forms), then the join proceeds as a fresh one.
    Log(job.run_id + ": node '" + node.node_id + "' is back on a new session");
    Unbind(owner->second, now, "it came back on a new session");
  }
  if (auto owner = job.sessions.find(node.node_id);
      owner != job.sessions.end() && owner->second != session) {
    Refuse(session, kRefusedDuplicate,
           "another agent already joined run '" + join.run_id + "' as node '" + node.node_id +
               "' (give each agent its own node id)");
    if (job.state.phase == Phase::kGathering && job.state.round < 0) {
      // Two agents claim one identity before the job ever ran: a configuration mistake (one
      // node_id given to several agents) that leaves the job a node short. The agents already
      // waiting are told now, not at their join timeout.
      job.state.phase = Phase::kFailed;
      Finish(job, false,
             "a second agent (on host " + node.host + ") asked to join as node '" + node.node_id +
                 "', which another agent holds: give each agent "
                 "its own --rdzv-conf node_id, or leave it unset (one per crun)");
    }
    return;
  }
  const NodeDescription desc = DescriptionOf(node, peer_ip);
  Transition t = rdzv::OnJoin(std::move(job.state), desc, settings, now);
  for (const auto& a : t.actions) {
    if (const auto* r = std::get_if<RefuseJoin>(&a); r != nullptr && r->node_id == desc.node_id) {
      job.state = std::move(t.state);
      return Refuse(session, RefusalCode(r->kind), r->reason);
    }
  }
  bound_[session] = Binding{job.run_id, desc.node_id};
  job.sessions[desc.node_id] = session;
  job.incarnations[desc.node_id] = node.incarnation;
  job.dialed[desc.node_id] = join.service_host;
  auto& addresses = job.addresses[desc.node_id];
  addresses.clear();
  if (!peer_ip.empty()) addresses.push_back(peer_ip);
  addresses.insert(addresses.end(), node.addresses.begin(), node.addresses.end());
  Apply(job, std::move(t), now);
}

// The node failed its health gate: counted and named, never joined. A session already bound
// (a re-join after "stop and re-join") stays bound until the agent leaves, which it does next.
void Engine::OnUnhealthy(SessionId session, const msg::Join& join, TimePoint now) {
  if (auto b = bound_.find(session);
      b != bound_.end() &&
      (b->second.run_id != join.run_id || b->second.node_id != join.node.node_id)) {
    return Refuse(session, kRefusedBadJoin,
                  "this session already joined run '" + b->second.run_id + "' as node '" +
                      b->second.node_id + "'");
  }
  Job& job = JobFor(join.run_id, join.settings, now);
  Log(job.run_id + ": node '" + join.node.node_id + "' on " + join.node.host +
      " failed its health check and stays out: " + join.unhealthy);
  if (options_.metrics != nullptr) options_.metrics->Unhealthy(job.run_id);
  Apply(job,
        rdzv::OnUnhealthy(std::move(job.state), {join.node.node_id, join.node.host, join.unhealthy},
                          now),
        now);
}

}  // namespace crun::rdzv
