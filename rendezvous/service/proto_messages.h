// The engine's messages (messages.h) to and from their wire form (crun.v1, rendezvous.proto).
// Used by the gRPC adapter (grpc_service.cc), the agent's session with the service
// (agent/rendezvous/service_rendezvous.cc) and the engine's fuzz target; nothing else in the
// service sees protobuf.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "crun/v1/rendezvous.pb.h"
#include "rendezvous/service/messages.h"

namespace crun::rdzv {

// nullopt for a message that carries nothing the service knows (an empty oneof, a newer kind).
std::optional<msg::AgentMessage> FromProto(const v1::AgentMessage& m);
msg::FailureReport FromProto(const v1::FailureReport& r);
// Settings to and from their wire form, generated from SettingFields(): a field absent (an
// agent that predates it), or a time of 0, is its default.
Settings FromProto(const v1::Settings& s);
v1::Settings ToProto(const Settings& s);

v1::ServiceMessage ToProto(const msg::ServiceMessage& m);
// An assignment on the wire in two pieces whose concatenation is one v1::ServiceMessage, so
// that a round's member list (O(nodes), the same for every node) is encoded once and shared by
// every node's message: EncodeMembers(list) once, then for each node
// EncodeAssignmentHead(its assignment, that piece's size) (protobuf's wire form lets a
// message's fields be encoded in separate runs). The head ignores the assignment's members.
std::string EncodeMembers(const std::vector<msg::RoundMember>& members);
std::string EncodeAssignmentHead(const msg::Assignment& a, std::size_t members_bytes);
v1::StatusResponse ToProto(const msg::StatusResponse& s);
v1::StacksResult ToProto(const msg::StacksResult& r);
// A failure report (rendezvous/report/report.h) on the wire: also what the agent's session
// sends when its workers fail, and reads back as the job's root cause.
v1::FailureReport ToProto(const msg::FailureReport& r);

}  // namespace crun::rdzv
