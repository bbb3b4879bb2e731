#include "agent/rendezvous/session_wire.h"

#include <utility>

#include "rendezvous/service/proto_messages.h"

namespace crun::agent {
namespace {

void RankToProto(const RankStacks& r, bool main_only, v1::RankStacks* out) {
  out->set_host(r.host);
  out->set_rank(r.rank);
  out->set_local_rank(r.local_rank);
  out->set_pid(r.pid);
  out->set_tool(r.tool);
  out->set_error(r.error);
  for (const auto& t : r.threads) {
    if (main_only && !t.main) continue;
    auto* pt = out->add_threads();
    pt->set_title(t.title);
    pt->set_main(t.main);
    for (const auto& f : t.frames) {
      auto* pf = pt->add_frames();
      pf->set_function(f.function);
      pf->set_file(f.file);
      pf->set_line(f.line);
    }
  }
}

RankStacks RankFromProto(const v1::RankStacks& p) {
  RankStacks r;
  r.host = p.host();
  r.rank = p.rank();
  r.local_rank = p.local_rank();
  r.pid = p.pid();
  r.tool = p.tool();
  r.error = p.error();
  for (const auto& pt : p.threads()) {
    ThreadStack t;
    t.title = pt.title();
    t.main = pt.main();
    for (const auto& pf : pt.frames()) t.frames.push_back({pf.function(), pf.file(), pf.line()});
    r.threads.push_back(std::move(t));
  }
  return r;
}

}  // namespace

v1::AgentMessage JoinMessage(const ServiceRendezvousOptions& o, std::uint64_t incarnation,
                             const std::vector<std::uint16_t>& ports,
                             const std::string& unhealthy) {
  v1::AgentMessage m;
  auto* j = m.mutable_join();
  j->set_unhealthy(unhealthy);
  j->set_protocol_version(kProtocolVersion);
  j->set_run_id(o.run_id);
  j->set_service_host(o.endpoint_host);
  auto* n = j->mutable_node();
  n->set_node_id(o.node_id);
  n->set_host(o.host);
  for (const auto& a : o.addresses) n->add_addresses(a);
  n->set_nproc(o.nproc);
  n->set_incarnation(incarnation);
  for (const auto port : ports) n->add_ports(port);
  if (o.requested_rank) n->set_requested_rank(*o.requested_rank);
  *j->mutable_settings() = rdzv::ToProto(o.settings);
  return m;
}

v1::AgentMessage HeartbeatMessage(std::uint64_t sequence, const SnapshotFacts* snapshot,
                                  StragglerExchange* stragglers) {
  v1::AgentMessage m;
  v1::Heartbeat* beat = m.mutable_heartbeat();
  beat->set_sequence(sequence);
  if (snapshot != nullptr && snapshot->bytes > 0) {
    beat->set_snapshot_bytes(snapshot->bytes);
    if (snapshot->step >= 0) beat->set_snapshot_step(snapshot->step);
    if (snapshot->disk_step >= 0) beat->set_disk_step(snapshot->disk_step);
  }
  if (stragglers != nullptr && !stragglers->outbox.empty()) {
    beat->set_compute_round(stragglers->round);
    for (const auto& f : std::exchange(stragglers->outbox, {})) {
      auto* figure = beat->add_compute();
      figure->set_rank(f.rank);
      figure->set_window(f.window);
      figure->set_compute_us(f.compute.count());
    }
  }
  return m;
}

v1::AgentMessage FailureMessage(const report::FailureReport& failures) {
  v1::AgentMessage m;
  *m.mutable_workers_failed() = rdzv::ToProto(failures);
  return m;
}

v1::AgentMessage StacksWantedMessage(std::uint64_t id, const std::string& reason,
                                     std::chrono::milliseconds timeout) {
  v1::AgentMessage m;
  auto* w = m.mutable_stacks_wanted();
  w->set_request_id(id);
  w->set_reason(reason);
  w->set_timeout_ms(timeout.count());
  return m;
}

v1::AgentMessage SucceededMessage() {
  v1::AgentMessage m;
  m.mutable_workers_succeeded();
  return m;
}

v1::AgentMessage LeaveMessage(const std::string& reason) {
  v1::AgentMessage m;
  m.mutable_leave()->set_reason(reason);
  return m;
}

v1::AgentMessage GoodputMessage(const std::string& ledger_json) {
  v1::AgentMessage m;
  m.mutable_goodput()->set_json(ledger_json);
  return m;
}

v1::AgentMessage StacksReplyMessage(std::uint64_t id, const std::string& node_id,
                                    const std::string& host, const std::vector<RankStacks>& ranks,
                                    const std::string& error) {
  v1::AgentMessage m;
  m.mutable_stacks_reply()->set_request_id(id);
  *m.mutable_stacks_reply()->mutable_node() = NodeStacksToProto(node_id, host, ranks, error);
  return m;
}

v1::NodeStacks NodeStacksToProto(const std::string& node_id, const std::string& host,
                                 const std::vector<RankStacks>& ranks, const std::string& error) {
  v1::NodeStacks out;
  out.set_node_id(node_id);
  out.set_host(host);
  out.set_error(error);
  for (const auto& r : ranks) RankToProto(r, false, out.add_ranks());
  if (out.ByteSizeLong() > kMaxNodeStacksBytes) {
    out.clear_ranks();
    for (const auto& r : ranks) RankToProto(r, true, out.add_ranks());
    out.set_error("only each rank's main thread: all threads take more than " +
                  std::to_string(kMaxNodeStacksBytes >> 10) + " KiB (they are in " + host +
                  "'s own report)");
  }
  return out;
}

RemoteStacks RemoteStacksFromProto(const v1::StacksResult& result) {
  RemoteStacks out;
  for (const auto& node : result.nodes()) {
    for (const auto& r : node.ranks()) out.ranks.push_back(RankFromProto(r));
    if (!node.error().empty()) {
      out.missing.push_back(node.node_id() + " (" + node.host() + "): " + node.error());
    }
  }
  out.missing.insert(out.missing.end(), result.missing().begin(), result.missing().end());
  return out;
}

GroupAssignment AssignmentFromProto(const v1::RoundAssignment& a, const RoundSelf& self) {
  std::vector<RoundMember> members;
  for (const auto& p : a.members()) {
    members.push_back({p.host(), p.address(), p.nproc(), {p.ports().begin(), p.ports().end()}});
  }
  GroupAssignment g = MakeGroupAssignment(self,
                                          {.group_rank = a.group_rank(),
                                           .group_world_size = a.group_world_size(),
                                           .world_size = a.world_size(),
                                           .base_rank = a.base_rank(),
                                           .round = a.round(),
                                           .restart_count = a.restart_count(),
                                           .spare = a.spare()},
                                          std::move(members));
  g.master_addr = a.master_addr();
  g.master_port = static_cast<std::uint16_t>(a.master_port());
  g.waited_for_nodes = std::chrono::milliseconds(a.waited_for_nodes_ms());
  return g;
}

StopNotice StopFromProto(const v1::StopAndRejoin& s) {
  return {s.reason(), s.spends_restart(), s.kind(),
          std::chrono::milliseconds(std::max<std::int64_t>(s.fault_ms_ago(), 0))};
}

JobOutcome OutcomeFromProto(const v1::JobFinished& f) {
  JobOutcome o;
  o.success = f.success();
  o.exit_code = f.exit_code();
  o.reason = f.reason();
  if (f.has_root_cause()) {
    o.root_node_id = f.root_cause().node_id();
    o.root_report = rdzv::FromProto(f.root_cause());
  }
  o.goodput.assign(f.goodput().begin(), f.goodput().end());
  return o;
}

std::vector<SlowRankVerdict> VerdictsFromProto(const v1::Stragglers& s) {
  std::vector<SlowRankVerdict> verdicts;
  for (const auto& v : s.changes()) {
    verdicts.push_back({{v.rank(), v.named(), v.ratio(), v.window()}, v.host()});
  }
  return verdicts;
}

}  // namespace crun::agent
