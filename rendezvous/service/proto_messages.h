// The engine's messages (messages.h) to and from their wire form (crun.v1, rendezvous.proto).
// Used by the gRPC adapter (grpc_service.cc), the agent's session with the service
// (agent/rendezvous/service_rendezvous.cc) and the engine's fuzz target; nothing else in the
// service sees protobuf.
#pragma once

#include <optional>

#include "crun/v1/rendezvous.pb.h"
#include "rendezvous/service/messages.h"

namespace crun::rdzv {

// nullopt for a message that carries nothing the service knows (an empty oneof, a newer kind).
std::optional<msg::AgentMessage> FromProto(const v1::AgentMessage& m);
msg::FailureReport FromProto(const v1::FailureReport& r);
// Settings from their wire form: a time of 0 is the default.
Settings FromProto(const v1::Settings& s);
v1::Settings ToProto(const Settings& s);

v1::ServiceMessage ToProto(const msg::ServiceMessage& m);
v1::StatusResponse ToProto(const msg::StatusResponse& s);
v1::StacksResult ToProto(const msg::StacksResult& r);
// A failure report (rendezvous/report/report.h) on the wire: also what the agent's session
// sends when its workers fail, and reads back as the job's root cause.
v1::FailureReport ToProto(const msg::FailureReport& r);

}  // namespace crun::rdzv
