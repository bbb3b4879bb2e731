// Limits a store server enforces on what one client may send or store. A request that breaks
// one is a protocol error for that connection only: the server logs it with the peer address
// and closes that connection; every other client carries on.
#pragma once

#include <cstddef>
#include <cstdint>

namespace crun {

struct StoreLimits {
  // Same key bound as PyTorch's libuv server; keys are paths like "/default_pg/0//cuda//0".
  std::size_t max_key_bytes = 8 * 1024;
  // Larger than libuv's 8 MiB: the classic server had no bound and some jobs store big blobs.
  std::size_t max_value_bytes = 64 * 1024 * 1024;
  // Keys in one CHECK / WAIT / MULTI_GET / MULTI_SET (libuv: 128 Ki).
  std::size_t max_keys_per_request = 128 * 1024;
  // All bytes of one request together (a MULTI_SET of many large values).
  std::size_t max_request_bytes = 256 * 1024 * 1024;
  // Keys plus values held by the whole store; writes past it close the writer's connection.
  std::uint64_t max_store_bytes = 4ULL * 1024 * 1024 * 1024;
  // WAITs and BARRIERs pending plus keys watched (1.13) on one connection. A c10d client
  // blocks on one wait at a time; only a misbehaving one pipelines thousands.
  std::size_t max_waits_per_connection = 1024;
  // Pending WAITs and BARRIERs of all connections together.
  std::size_t max_pending_waits = 1024 * 1024;
};

}  // namespace crun
