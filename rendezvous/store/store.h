// Store: the key/value interface that workers, agents and tests use, with c10d semantics
// (docs/store_protocol.md). Implementations: MemoryStore (in-process), TcpStoreClient (the wire
// protocol, against crun's server or PyTorch's), PrefixStore (a namespace over another store).
//
// Every failure the network, a peer or a caller can cause comes back as a Status whose message
// names the store endpoint and the keys involved. Calls block; Get, MultiGet, blocking
// QueuePop, Wait and Barrier block up to a timeout. Implementations are safe to call from
// several threads (calls on one store are serialised).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace crun {

using Millis = std::chrono::milliseconds;
inline constexpr Millis kDefaultStoreTimeout{300'000};  // c10d's default

class Store {
 public:
  virtual ~Store() = default;

  virtual Status Set(std::string_view key, std::string_view value) = 0;
  // Waits up to timeout() for the key to exist, then returns its value.
  virtual StatusOr<std::string> Get(std::string_view key) = 0;
  virtual StatusOr<std::string> CompareSet(std::string_view key, std::string_view expected,
                                           std::string_view desired) = 0;
  virtual StatusOr<std::int64_t> Add(std::string_view key, std::int64_t delta) = 0;
  // True when every key exists.
  virtual StatusOr<bool> Check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; kTimeout after `timeout`.
  virtual Status Wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  Status Wait(const std::vector<std::string>& keys) { return Wait(keys, timeout()); }
  virtual StatusOr<std::int64_t> NumKeys() = 0;
  // True when the key existed.
  virtual StatusOr<bool> DeleteKey(std::string_view key) = 0;
  virtual Status Append(std::string_view key, std::string_view value) = 0;
  // Waits up to timeout() for all keys, then returns their values in order.
  virtual StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys) = 0;
  virtual Status MultiSet(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) = 0;
  virtual Status QueuePush(std::string_view key, std::string_view value) = 0;
  // Pops the front value. With `block`, waits up to timeout() for one; kNotFound when empty.
  virtual StatusOr<std::string> QueuePop(std::string_view key, bool block) = 0;
  virtual StatusOr<std::int64_t> QueueLen(std::string_view key) = 0;
  // All keys, sorted.
  virtual StatusOr<std::vector<std::string>> ListKeys() = 0;
  // Counts arrivals at `key`; returns once `world_size` callers arrived, kTimeout otherwise.
  virtual Status Barrier(std::string_view key, std::int64_t world_size, Millis timeout) = 0;

  Millis timeout() const { return timeout_; }
  void set_timeout(Millis timeout) { timeout_ = timeout; }

 protected:
  Millis timeout_ = kDefaultStoreTimeout;
};

}  // namespace crun
