// The version of the crun.v1 rendezvous protocol (proto/crun/v1/rendezvous.proto) that this
// build speaks: agents send it in Join, and the service refuses a different one. One
// definition for both sides.
#pragma once

#include <cstdint>

namespace crun {

inline constexpr std::uint32_t kProtocolVersion = 1;

// StacksRequest.reason when `crun stacks --rdzv-endpoint` asked (any other reason is a hang on
// another node, which each node also reports itself).
inline constexpr char kStacksCommandReason[] = "crun stacks";

}  // namespace crun
