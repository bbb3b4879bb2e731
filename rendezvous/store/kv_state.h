// KvState: the store's keys, values, queues and server-side waiters, following the c10d
// TCPStore semantics (docs/store_protocol.md). It is the one implementation of those rules:
// the TCP server and MemoryStore both drive it, so the contract suite tests it twice.
//
// Not thread-safe: the owner serialises calls (the server runs it on one event loop,
// MemoryStore under a mutex). Listeners are called synchronously from inside the write that
// completes their wait, so a connection can queue its reply bytes in order.
//
// Listeners must not call back into KvState from OnWaitDone/OnWatchEvent: they queue bytes and
// return (a connection that fails to write closes later, from its own event handler).
//
// Waits are registered against the keys that are missing and woken exactly once: a listener's
// OnWaitDone runs once per completed wait and never after CancelWaits() or Forget().
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "rendezvous/store/wire.h"

namespace crun {

class StoreListener {
 public:
  // A WAIT (or BARRIER) of this listener is complete: send one STOP_WAITING.
  virtual void OnWaitDone() = 0;
  // A watched key changed (1.13 WATCH_KEY). `old_value`/`new_value` are empty when absent.
  virtual void OnWatchEvent(wire::WatchEvent event, std::string_view key,
                            std::string_view old_value, std::string_view new_value) = 0;

 protected:
  ~StoreListener() = default;
};

class KvState {
 public:
  explicit KvState(std::uint64_t max_bytes) : max_bytes_(max_bytes) {}
  KvState(const KvState&) = delete;
  KvState& operator=(const KvState&) = delete;
  ~KvState();

  // Writes wake the waiters of `key`. They fail only when the byte limit would be passed,
  // or (ADD, BARRIER) when the current value is not a decimal integer or would overflow.
  Status Set(std::string key, std::string value);
  // c10d rules: absent key and empty `expected` -> store `desired`; absent key otherwise ->
  // return `expected`, store nothing; present and equal -> store `desired`. Returns the value
  // the key holds afterwards (or `expected` in the absent case).
  StatusOr<std::string> CompareSet(std::string key, std::string expected, std::string desired);
  StatusOr<std::int64_t> Add(std::string key, std::int64_t delta);
  Status Append(std::string key, std::string_view value);

  const std::string* Get(const std::string& key) const;
  // True when every key holds a value or a non-empty queue.
  bool Check(const std::vector<std::string>& keys) const;
  bool DeleteKey(const std::string& key);
  std::int64_t NumKeys() const { return static_cast<std::int64_t>(data_.size()); }
  std::vector<std::string> ListKeys() const;

  Status QueuePush(std::string key, std::string value);  // wakes one waiter
  // Pops the front value; `length_before` is the queue's length before the pop (0: empty).
  std::optional<std::string> QueuePop(const std::string& key, std::int64_t* length_before);
  std::int64_t QueueLen(const std::string& key) const;

  // Returns true when all keys exist now (reply at once). Otherwise registers a wait that calls
  // listener->OnWaitDone() once all of them exist.
  bool Wait(const std::vector<std::string>& keys, StoreListener* listener);
  // Adds one to the decimal counter at `key`. Returns true when it reached `world_size` (this
  // caller and every earlier arriver are released); otherwise registers the listener.
  StatusOr<bool> Barrier(std::string key, std::int64_t world_size, StoreListener* listener);
  // Drops the listener's pending waits. Returns whether any was pending.
  bool CancelWaits(StoreListener* listener);

  // 1.13 WATCH_KEY: the listener is told of every later change of `key` until Forget().
  void Watch(const std::string& key, StoreListener* listener);
  // The listener is going away (its connection closed): drop its waits and watches.
  void Forget(StoreListener* listener);

  std::uint64_t bytes() const { return bytes_; }
  std::size_t pending_waits() const { return pending_; }
  // WAITs and BARRIERs of this listener not answered yet, plus the keys it watches.
  std::size_t held_by(const StoreListener* listener) const;

 private:
  struct Waiter {
    StoreListener* listener;
    std::size_t remaining;
    std::vector<std::string> keys;
  };

  bool Exists(const std::string& key) const;
  Status Reserve(std::string_view key, std::uint64_t old_bytes, std::uint64_t new_bytes);
  void WakeAll(const std::string& key);
  void WakeOne(const std::string& key);
  void Complete(Waiter* waiter);
  void Register(std::unique_ptr<Waiter> waiter, const std::vector<std::string>& on_keys);
  void Notify(wire::WatchEvent event, const std::string& key, std::string_view old_value,
              std::string_view new_value);

  std::uint64_t max_bytes_;
  std::uint64_t bytes_ = 0;
  std::size_t pending_ = 0;  // registered waiters
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, std::vector<Waiter*>> waiting_;  // key -> waiters on it
  std::unordered_map<StoreListener*, std::vector<std::unique_ptr<Waiter>>> waits_of_;
  std::unordered_map<std::string, std::vector<StoreListener*>> watchers_;
  std::unordered_map<StoreListener*, std::vector<std::string>> watched_by_;
};

}  // namespace crun
