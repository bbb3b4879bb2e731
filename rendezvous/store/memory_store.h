// MemoryStore: a thread-safe Store in this process's memory, driving the same KvState as the
// TCP server (so both follow one implementation of the c10d rules). For multi-rank tests run as
// threads, and for agents that keep a store without a socket.
#pragma once

#include <condition_variable>
#include <mutex>

#include "rendezvous/store/kv_state.h"
#include "rendezvous/store/limits.h"
#include "rendezvous/store/store.h"

namespace crun {

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(const StoreLimits& limits = {});

  Status Set(std::string_view key, std::string_view value) override;
  StatusOr<std::string> Get(std::string_view key) override;
  StatusOr<std::string> CompareSet(std::string_view key, std::string_view expected,
                                   std::string_view desired) override;
  StatusOr<std::int64_t> Add(std::string_view key, std::int64_t delta) override;
  StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  Status Wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::Wait;
  StatusOr<std::int64_t> NumKeys() override;
  StatusOr<bool> DeleteKey(std::string_view key) override;
  Status Append(std::string_view key, std::string_view value) override;
  StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys) override;
  Status MultiSet(const std::vector<std::string>& keys,
                  const std::vector<std::string>& values) override;
  Status QueuePush(std::string_view key, std::string_view value) override;
  StatusOr<std::string> QueuePop(std::string_view key, bool block) override;
  StatusOr<std::int64_t> QueueLen(std::string_view key) override;
  StatusOr<std::vector<std::string>> ListKeys() override;
  Status Barrier(std::string_view key, std::int64_t world_size, Millis timeout) override;

  // Waits and barriers blocked right now (observability, and tests that need a waiter in place).
  std::size_t pending_waits();

 private:
  // Registers `start` (a wait or barrier) and blocks until it completes or `timeout` passes.
  template <typename Start>
  Status BlockUntilDone(std::unique_lock<std::mutex>& lock, Millis timeout, Start start,
                        const std::string& what);

  StoreLimits limits_;
  std::mutex mu_;
  std::condition_variable cv_;
  KvState state_;
};

}  // namespace crun
