#include "rendezvous/service/proto_messages.h"

#include "rendezvous/report/report_proto.h"

#include <array>
#include <optional>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

namespace crun::rdzv {
namespace {

msg::Join JoinFromProto(const v1::Join& j) {
  msg::Join out;
  out.protocol_version = j.protocol_version();
  out.run_id = j.run_id();
  const auto& n = j.node();
  out.node.node_id = n.node_id();
  out.node.host = n.host();
  out.node.addresses.assign(n.addresses().begin(), n.addresses().end());
  out.node.nproc = n.nproc();
  if (n.has_requested_rank()) out.node.requested_rank = n.requested_rank();
  out.node.incarnation = n.incarnation();
  for (const auto port : n.ports()) {
    // A port is 1..65535; anything else is not one this agent could have reserved.
    if (port == 0 || port > 65535) continue;
    out.node.ports.push_back(static_cast<std::uint16_t>(port));
  }
  out.settings = FromProto(j.settings());
  out.service_host = j.service_host();
  out.unhealthy = j.unhealthy();
  return out;
}

void MembersToProto(const std::vector<msg::RoundMember>& members, v1::RoundAssignment* r) {
  for (const auto& m : members) {
    auto* p = r->add_members();
    p->set_host(m.host);
    p->set_address(m.address);
    p->set_nproc(m.nproc);
    for (const auto port : m.ports) p->add_ports(port);
  }
}

void GoodputToProto(const msg::GoodputFigures& f, v1::GoodputFigures* out) {
  out->set_known(f.known);
  out->set_ratio(f.ratio);
  for (const auto& [category, seconds] : f.seconds) {
    auto* s = out->add_seconds();
    s->set_category(category);
    s->set_seconds(seconds);
  }
  out->set_incidents(f.incidents);
  out->set_summary(f.summary);
}

void VerdictToProto(const StragglerChange& c, const std::string& host, v1::StragglerVerdict* out) {
  out->set_rank(c.rank);
  out->set_named(c.named);
  out->set_ratio(c.ratio);
  out->set_window(c.window);
  out->set_host(host);
}

struct ServiceToProto {
  v1::ServiceMessage& out;

  void operator()(const msg::Assignment& a) const {
    auto* r = out.mutable_assignment();
    r->set_round(a.round);
    r->set_group_rank(a.group_rank);
    r->set_group_world_size(a.group_world_size);
    r->set_base_rank(a.base_rank);
    r->set_world_size(a.world_size);
    r->set_master_addr(a.master_addr);
    r->set_master_port(a.master_port);
    r->set_restart_count(a.restart_count);
    r->set_spare(a.spare);
    r->set_durable_service(a.durable_service);
    r->set_judges_stragglers(a.judges_stragglers);
    r->set_waited_for_nodes_ms(a.waited_for_nodes_ms);
    if (a.members) MembersToProto(*a.members, r);
  }
  void operator()(const msg::StopAndRejoin& s) const {
    out.mutable_stop_and_rejoin()->set_reason(s.reason);
    out.mutable_stop_and_rejoin()->set_spends_restart(s.spends_restart);
    out.mutable_stop_and_rejoin()->set_kind(s.kind);
    out.mutable_stop_and_rejoin()->set_fault_ms_ago(s.fault_ms_ago);
  }
  void operator()(const msg::JobFinished& f) const {
    auto* r = out.mutable_finished();
    r->set_success(f.success);
    r->set_reason(f.reason);
    if (f.root_cause) report::ToProto(*f.root_cause, r->mutable_root_cause());
    r->set_exit_code(f.exit_code);
    for (const auto& g : f.goodput) r->add_goodput(g);
  }
  void operator()(const msg::Refused& r) const { out.mutable_refused()->set_reason(r.reason); }
  void operator()(const msg::StacksRequest& r) const {
    out.mutable_stacks_request()->set_request_id(r.request_id);
    out.mutable_stacks_request()->set_reason(r.reason);
  }
  void operator()(const msg::StacksResult& r) const { *out.mutable_stacks_result() = ToProto(r); }
  void operator()(const msg::Stragglers& s) const {
    auto* p = out.mutable_stragglers();
    p->set_round(s.round);
    for (const auto& v : s.changes) VerdictToProto(v.change, v.host, p->add_changes());
  }
};

}  // namespace

msg::FailureReport FromProto(const v1::FailureReport& r) { return report::FromProto(r); }

// A job's settings cross the wire as SettingFields() lists them (rules/settings.h), each one
// varint at its proto_number: the same bytes protobuf writes for crun.v1.Settings, which
// service_unit_tests holds to the list. A setting added to the list crosses with no line here.
Settings FromProto(const v1::Settings& s) {
  namespace wire = google::protobuf::internal;
  const std::string bytes = s.SerializeAsString();
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  std::array<std::optional<std::uint64_t>, 64> read;  // by field number: its last value
  while (const std::uint32_t tag = in.ReadTag()) {
    const int number = wire::WireFormatLite::GetTagFieldNumber(tag);
    std::uint64_t value = 0;
    if (wire::WireFormatLite::GetTagWireType(tag) == wire::WireFormatLite::WIRETYPE_VARINT &&
        number < static_cast<int>(read.size()) && in.ReadVarint64(&value)) {
      read[number] = value;
    } else if (!wire::WireFormatLite::SkipField(&in, tag)) {
      break;
    }
  }
  // A field absent keeps its default (an agent that predates it sent none); so does a time
  // of 0.
  Settings out;
  for (const auto& f : SettingFields()) {
    if (f.proto_number == 0 || !read.at(f.proto_number)) continue;
    const auto value = static_cast<std::int64_t>(*read.at(f.proto_number));
    if (f.kind == SettingField::Kind::kMillis && value == 0) continue;
    f.set(out, value);
  }
  return out;
}

v1::Settings ToProto(const Settings& s) {
  namespace wire = google::protobuf::internal;
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    for (const auto& f : SettingFields()) {
      if (f.proto_number == 0) continue;
      out.WriteTag(
          wire::WireFormatLite::MakeTag(f.proto_number, wire::WireFormatLite::WIRETYPE_VARINT));
      // A negative int32 is its int64's ten bytes on the wire, as protobuf writes it.
      out.WriteVarint64(static_cast<std::uint64_t>(f.get(s)));
    }
  }
  v1::Settings out;
  out.ParseFromString(bytes);
  return out;
}

std::optional<msg::AgentMessage> FromProto(const v1::AgentMessage& m) {
  switch (m.kind_case()) {
    case v1::AgentMessage::kJoin:
      return JoinFromProto(m.join());
    case v1::AgentMessage::kHeartbeat: {
      const v1::Heartbeat& h = m.heartbeat();
      msg::Heartbeat beat{h.sequence(),
                          {h.snapshot_bytes(), h.has_snapshot_step() ? h.snapshot_step() : -1,
                           h.has_disk_step() ? h.disk_step() : -1},
                          {},
                          h.compute_round()};
      for (const auto& f : h.compute()) {
        beat.compute.push_back({f.rank(), f.window(), std::chrono::microseconds(f.compute_us())});
      }
      return beat;
    }
    case v1::AgentMessage::kWorkersFailed:
      return FromProto(m.workers_failed());
    case v1::AgentMessage::kWorkersSucceeded:
      return msg::WorkersSucceeded{};
    case v1::AgentMessage::kLeave:
      return msg::Leave{m.leave().reason()};
    case v1::AgentMessage::kStacksWanted:
      return msg::StacksWanted{m.stacks_wanted().request_id(), m.stacks_wanted().reason(),
                               m.stacks_wanted().timeout_ms()};
    case v1::AgentMessage::kStacksReply:
      // Forwarded as it came, never read by the service.
      return msg::StacksReply{m.stacks_reply().request_id(),
                              m.stacks_reply().node().SerializeAsString()};
    case v1::AgentMessage::kGoodput:
      return msg::Goodput{m.goodput().json()};
    case v1::AgentMessage::KIND_NOT_SET:
      break;
  }
  return std::nullopt;
}

v1::ServiceMessage ToProto(const msg::ServiceMessage& m) {
  v1::ServiceMessage out;
  std::visit(ServiceToProto{out}, m);
  return out;
}

v1::StacksResult ToProto(const msg::StacksResult& r) {
  v1::StacksResult out;
  out.set_request_id(r.request_id);
  out.set_run_id(r.run_id);
  out.set_round(r.round);
  for (const auto& bytes : r.nodes) {
    if (!out.add_nodes()->ParseFromString(bytes)) out.mutable_nodes()->RemoveLast();
  }
  for (const auto& m : r.missing) out.add_missing(m);
  return out;
}

v1::StatusResponse ToProto(const msg::StatusResponse& s) {
  v1::StatusResponse out;
  for (const auto& job : s.jobs) {
    auto* j = out.add_jobs();
    j->set_run_id(job.run_id);
    j->set_phase(job.phase);
    j->set_round(job.round);
    j->set_restarts_used(job.restarts_used);
    j->set_max_restarts(job.max_restarts);
    j->set_min_nodes(job.min_nodes);
    j->set_max_nodes(job.max_nodes);
    j->set_world_size(job.world_size);
    j->set_last_failure(job.last_failure);
    for (const auto& h : job.lost_hosts) j->add_lost_hosts(h);
    j->set_unhealthy_reports(job.unhealthy_reports);
    if (job.goodput) GoodputToProto(*job.goodput, j->mutable_goodput());
    for (const auto& n : job.nodes) {
      auto* ns = j->add_nodes();
      ns->set_node_id(n.node_id);
      ns->set_host(n.host);
      ns->set_state(n.state);
      ns->set_group_rank(n.group_rank);
      ns->set_nproc(n.nproc);
      ns->set_snapshot_bytes(n.snapshots.bytes);
      if (n.snapshots.step >= 0) ns->set_snapshot_step(n.snapshots.step);
      if (n.snapshots.disk_step >= 0) ns->set_disk_step(n.snapshots.disk_step);
      ns->set_last_heartbeat_ms_ago(n.last_heartbeat_ms_ago);
      ns->set_reason(n.reason);
      for (const auto& c : n.stragglers) VerdictToProto(c, n.host, ns->add_stragglers());
      if (n.goodput) GoodputToProto(*n.goodput, ns->mutable_goodput());
    }
  }
  return out;
}

v1::FailureReport ToProto(const msg::FailureReport& r) {
  v1::FailureReport out;
  report::ToProto(r, &out);
  return out;
}

std::string EncodeMembers(const std::vector<msg::RoundMember>& members) {
  v1::RoundAssignment only;
  MembersToProto(members, &only);
  return only.SerializeAsString();  // field 11's entries, nothing else
}

std::string EncodeAssignmentHead(const msg::Assignment& a, std::size_t members_bytes) {
  msg::Assignment rest = a;
  rest.members.reset();
  const std::string fields = ToProto(msg::ServiceMessage{rest}).assignment().SerializeAsString();
  using google::protobuf::internal::WireFormatLite;
  std::string head;
  {
    google::protobuf::io::StringOutputStream stream(&head);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteTag(WireFormatLite::MakeTag(v1::ServiceMessage::kAssignmentFieldNumber,
                                         WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint64(fields.size() + members_bytes);
    out.WriteString(fields);
  }
  return head;
}

}  // namespace crun::rdzv
