#include "rendezvous/store/memory_store.h"

namespace crun {
namespace {

// Wakes the blocked caller; called under the store mutex, so it only flips a flag.
class Waker final : public StoreListener {
 public:
  explicit Waker(std::condition_variable* cv) : cv_(cv) {}
  void OnWaitDone() override {
    done = true;
    cv_->notify_all();
  }
  void OnWatchEvent(wire::WatchEvent, std::string_view, std::string_view,
                    std::string_view) override {}
  bool done = false;

 private:
  std::condition_variable* cv_;
};

}  // namespace

MemoryStore::MemoryStore(const StoreLimits& limits)
    : limits_(limits), state_(limits.max_store_bytes) {}

template <typename Start>
Status MemoryStore::BlockUntilDone(std::unique_lock<std::mutex>& lock, Millis timeout, Start start,
                                   const std::string& what) {
  Waker waker(&cv_);
  auto ready = start(&waker);
  if (!ready.ok()) return ready.status();
  if (*ready) return Status::Ok();
  const bool done = cv_.wait_for(lock, timeout, [&] { return waker.done; });
  if (done) return Status::Ok();
  state_.CancelWaits(&waker);
  return TimeoutError(what + " timed out after " + std::to_string(timeout.count()) +
                      " ms (in-memory store)");
}

Status MemoryStore::Set(std::string_view key, std::string_view value) {
  std::lock_guard lock(mu_);
  return state_.Set(std::string(key), std::string(value));
}

StatusOr<std::string> MemoryStore::Get(std::string_view key) {
  std::unique_lock lock(mu_);
  std::vector<std::string> keys{std::string(key)};
  CRUN_RETURN_IF_ERROR(BlockUntilDone(
      lock, timeout_, [&](StoreListener* l) -> StatusOr<bool> { return state_.Wait(keys, l); },
      "get of key " + keys[0]));
  const std::string* value = state_.Get(keys[0]);
  if (value == nullptr) return NotFound("key '" + keys[0] + "' was deleted before it was read");
  return *value;
}

StatusOr<std::string> MemoryStore::CompareSet(std::string_view key, std::string_view expected,
                                              std::string_view desired) {
  std::lock_guard lock(mu_);
  return state_.CompareSet(std::string(key), std::string(expected), std::string(desired));
}

StatusOr<std::int64_t> MemoryStore::Add(std::string_view key, std::int64_t delta) {
  std::lock_guard lock(mu_);
  return state_.Add(std::string(key), delta);
}

StatusOr<bool> MemoryStore::Check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  return state_.Check(keys);
}

Status MemoryStore::Wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock lock(mu_);
  return BlockUntilDone(
      lock, timeout, [&](StoreListener* l) -> StatusOr<bool> { return state_.Wait(keys, l); },
      "wait for keys " + DescribeKeys(keys));
}

StatusOr<std::int64_t> MemoryStore::NumKeys() {
  std::lock_guard lock(mu_);
  return state_.NumKeys();
}

StatusOr<bool> MemoryStore::DeleteKey(std::string_view key) {
  std::lock_guard lock(mu_);
  return state_.DeleteKey(std::string(key));
}

Status MemoryStore::Append(std::string_view key, std::string_view value) {
  std::lock_guard lock(mu_);
  return state_.Append(std::string(key), value);
}

StatusOr<std::vector<std::string>> MemoryStore::MultiGet(const std::vector<std::string>& keys) {
  std::unique_lock lock(mu_);
  CRUN_RETURN_IF_ERROR(BlockUntilDone(
      lock, timeout_, [&](StoreListener* l) -> StatusOr<bool> { return state_.Wait(keys, l); },
      "multi_get of keys " + DescribeKeys(keys)));
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) {
    const std::string* value = state_.Get(key);
    if (value == nullptr) return NotFound("key '" + key + "' was deleted before it was read");
    values.push_back(*value);
  }
  return values;
}

Status MemoryStore::MultiSet(const std::vector<std::string>& keys,
                             const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return InvalidArgument("multi_set got " + std::to_string(keys.size()) + " keys but " +
                           std::to_string(values.size()) + " values");
  }
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < keys.size(); ++i)
    CRUN_RETURN_IF_ERROR(state_.Set(keys[i], values[i]));
  return Status::Ok();
}

Status MemoryStore::QueuePush(std::string_view key, std::string_view value) {
  std::lock_guard lock(mu_);
  return state_.QueuePush(std::string(key), std::string(value));
}

StatusOr<std::string> MemoryStore::QueuePop(std::string_view key, bool block) {
  std::unique_lock lock(mu_);
  std::vector<std::string> keys{std::string(key)};
  if (block) {
    CRUN_RETURN_IF_ERROR(BlockUntilDone(
        lock, timeout_, [&](StoreListener* l) -> StatusOr<bool> { return state_.Wait(keys, l); },
        "queue_pop of key " + keys[0]));
  }
  std::int64_t length = 0;
  auto value = state_.QueuePop(keys[0], &length);
  if (!value) return NotFound("queue '" + keys[0] + "' is empty");
  return *std::move(value);
}

StatusOr<std::int64_t> MemoryStore::QueueLen(std::string_view key) {
  std::lock_guard lock(mu_);
  return state_.QueueLen(std::string(key));
}

StatusOr<std::vector<std::string>> MemoryStore::ListKeys() {
  std::lock_guard lock(mu_);
  return state_.ListKeys();
}

Status MemoryStore::Barrier(std::string_view key, std::int64_t world_size, Millis timeout) {
  std::unique_lock lock(mu_);
  std::string k(key);
  return BlockUntilDone(
      lock, timeout, [&](StoreListener* l) { return state_.Barrier(k, world_size, l); },
      "barrier on key " + k + " (world size " + std::to_string(world_size) + ")");
}

std::size_t MemoryStore::pending_waits() {
  std::lock_guard lock(mu_);
  return state_.pending_waits();
}

}  // namespace crun
