// Stacks on the wire (crun.v1.NodeStacks, StacksResult: proto/crun/v1/rendezvous.proto): what
// an agent sends when the service asks for its ranks' stacks, and what the detecting agent and
// `crun stacks --rdzv-endpoint` read back. Threads and frames travel; the tools' raw output
// stays on its node (in its own report and attempt_<n>/stacks/).
#pragma once

#include <string>
#include <vector>

#include "agent/hangs/stack_model.h"
#include "crun/v1/rendezvous.pb.h"

namespace crun::agent {

// A node's answer. One larger than kMaxNodeStacksBytes keeps only each rank's main thread (and
// says so in `error`), so that one node's answer never crowds out the others'.
inline constexpr std::size_t kMaxNodeStacksBytes = std::size_t{1} << 20;
v1::NodeStacks NodeStacksToProto(const std::string& node_id, const std::string& host,
                                 const std::vector<RankStacks>& ranks, const std::string& error);

RemoteStacks RemoteStacksFromProto(const v1::StacksResult& result);

}  // namespace crun::agent
