#include "rendezvous/store/kv_state.h"

#include <algorithm>
#include <charconv>

namespace crun {
namespace {

using wire::WatchEvent;

// ADD keeps counters as ASCII decimal, like the c10d servers.
StatusOr<std::int64_t> ParseCounter(const std::string& key, const std::string& value) {
  std::int64_t v = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || ptr != end || value.empty()) {
    std::string shown = value.size() > 32 ? value.substr(0, 32) + "..." : value;
    return InvalidArgument("ADD on key '" + key + "': value '" + shown +
                           "' is not a decimal integer");
  }
  return v;
}

void EraseOne(std::vector<StoreListener*>& list, StoreListener* listener) {
  auto it = std::find(list.begin(), list.end(), listener);
  if (it != list.end()) list.erase(it);
}

}  // namespace

KvState::~KvState() = default;

bool KvState::Exists(const std::string& key) const {
  if (data_.contains(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

Status KvState::Reserve(std::string_view key, std::uint64_t old_bytes, std::uint64_t new_bytes) {
  const std::uint64_t after = bytes_ - old_bytes + new_bytes;
  if (new_bytes > old_bytes && after > max_bytes_) {
    return ResourceExhausted("store holds " + std::to_string(bytes_) + " bytes; writing key '" +
                             std::string(key.substr(0, 256)) + "' (" + std::to_string(new_bytes) +
                             " bytes) would pass the limit of " + std::to_string(max_bytes_) +
                             " bytes");
  }
  bytes_ = after;
  return Status::Ok();
}

Status KvState::Set(std::string key, std::string value) {
  auto it = data_.find(key);
  const std::uint64_t old_bytes = it == data_.end() ? 0 : key.size() + it->second.size();
  CRUN_RETURN_IF_ERROR(Reserve(key, old_bytes, key.size() + value.size()));
  const bool watched = !watchers_.empty();
  if (it != data_.end()) {
    std::string old_value = watched ? std::move(it->second) : std::string();
    it->second = std::move(value);
    if (watched) Notify(WatchEvent::kUpdated, it->first, old_value, it->second);
  } else {
    it = data_.emplace(std::move(key), std::move(value)).first;
    if (watched) Notify(WatchEvent::kCreated, it->first, {}, it->second);
  }
  WakeAll(it->first);
  return Status::Ok();
}

StatusOr<std::string> KvState::CompareSet(std::string key, std::string expected,
                                          std::string desired) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return expected;
  } else if (it->second != expected) {
    return it->second;
  }
  std::string result = desired;
  CRUN_RETURN_IF_ERROR(Set(std::move(key), std::move(desired)));
  return result;
}

StatusOr<std::int64_t> KvState::Add(std::string key, std::int64_t delta) {
  std::int64_t current = 0;
  if (auto it = data_.find(key); it != data_.end()) {
    auto parsed = ParseCounter(key, it->second);
    if (!parsed.ok()) return parsed.status();
    current = *parsed;
  }
  std::int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) {
    return InvalidArgument("ADD on key '" + key + "': " + std::to_string(current) + " + " +
                           std::to_string(delta) + " overflows a 64-bit counter");
  }
  CRUN_RETURN_IF_ERROR(Set(std::move(key), std::to_string(result)));
  return result;
}

Status KvState::Append(std::string key, std::string_view value) {
  auto it = data_.find(key);
  if (it == data_.end()) return Set(std::move(key), std::string(value));
  CRUN_RETURN_IF_ERROR(Reserve(key, 0, value.size()));
  std::string old_value = watchers_.empty() ? std::string() : it->second;
  it->second.append(value);
  if (!watchers_.empty()) Notify(WatchEvent::kUpdated, key, old_value, it->second);
  WakeAll(key);
  return Status::Ok();
}

const std::string* KvState::Get(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

bool KvState::Check(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [this](const auto& k) { return Exists(k); });
}

bool KvState::DeleteKey(const std::string& key) {
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  bytes_ -= key.size() + it->second.size();
  std::string old_value = std::move(it->second);
  data_.erase(it);
  if (!watchers_.empty()) Notify(WatchEvent::kDeleted, key, old_value, {});
  return true;
}

std::vector<std::string> KvState::ListKeys() const {
  std::vector<std::string> keys;
  keys.reserve(data_.size());
  for (const auto& [k, v] : data_) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  return keys;
}

Status KvState::QueuePush(std::string key, std::string value) {
  CRUN_RETURN_IF_ERROR(Reserve(key, 0, key.size() + value.size()));
  queues_[key].push_back(std::move(value));
  WakeOne(key);
  return Status::Ok();
}

std::optional<std::string> KvState::QueuePop(const std::string& key, std::int64_t* length_before) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) {
    *length_before = 0;
    return std::nullopt;
  }
  *length_before = static_cast<std::int64_t>(it->second.size());
  std::string value = std::move(it->second.front());
  it->second.pop_front();
  bytes_ -= key.size() + value.size();
  if (it->second.empty()) queues_.erase(it);
  return value;
}

std::int64_t KvState::QueueLen(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size());
}

void KvState::Register(std::unique_ptr<Waiter> waiter, const std::vector<std::string>& on_keys) {
  for (const auto& key : on_keys) waiting_[key].push_back(waiter.get());
  waits_of_[waiter->listener].push_back(std::move(waiter));
  ++pending_;
}

bool KvState::Wait(const std::vector<std::string>& keys, StoreListener* listener) {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (!Exists(key)) missing.push_back(key);
  }
  if (missing.empty()) return true;
  auto waiter = std::make_unique<Waiter>(Waiter{listener, missing.size(), {}});
  waiter->keys = missing;
  Register(std::move(waiter), missing);
  return false;
}

StatusOr<bool> KvState::Barrier(std::string key, std::int64_t world_size, StoreListener* listener) {
  std::int64_t count = 0;
  if (auto it = data_.find(key); it != data_.end()) {
    auto parsed = ParseCounter(key, it->second);
    if (!parsed.ok()) return parsed.status();
    count = *parsed;
  }
  if (__builtin_add_overflow(count, 1, &count)) {
    return InvalidArgument("BARRIER on key '" + key + "': counter overflows");
  }
  std::string value = std::to_string(count);
  auto it = data_.find(key);
  const std::uint64_t old_bytes = it == data_.end() ? 0 : key.size() + it->second.size();
  CRUN_RETURN_IF_ERROR(Reserve(key, old_bytes, key.size() + value.size()));
  // Stored without waking: the earlier arrivers wait for the count, not for a change.
  if (it == data_.end()) {
    data_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  if (count >= world_size) {
    WakeAll(key);  // the earlier arrivers
    return true;
  }
  // The counter key exists, so the waiter is registered on it directly.
  auto waiter = std::make_unique<Waiter>(Waiter{listener, 1, {key}});
  Register(std::move(waiter), {key});
  return false;
}

void KvState::Complete(Waiter* waiter) {
  StoreListener* listener = waiter->listener;
  auto& mine = waits_of_[listener];
  auto it =
      std::find_if(mine.begin(), mine.end(), [&](const auto& w) { return w.get() == waiter; });
  std::unique_ptr<Waiter> owned = std::move(*it);
  mine.erase(it);
  --pending_;
  if (mine.empty()) waits_of_.erase(listener);
  listener->OnWaitDone();
}

void KvState::WakeAll(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  std::vector<Waiter*> list = std::move(it->second);
  waiting_.erase(it);
  for (Waiter* w : list) {
    if (--w->remaining == 0) Complete(w);
  }
}

void KvState::WakeOne(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  auto& list = it->second;
  std::size_t seen = 0;
  Waiter* done = nullptr;
  while (seen < list.size() && done == nullptr) {
    Waiter* w = list[seen++];
    if (--w->remaining == 0) done = w;
  }
  list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(seen));
  if (list.empty()) waiting_.erase(it);
  if (done != nullptr) Complete(done);
}

bool KvState::CancelWaits(StoreListener* listener) {
  auto it = waits_of_.find(listener);
  if (it == waits_of_.end()) return false;
  for (const auto& waiter : it->second) {
    for (const auto& key : waiter->keys) {
      auto w = waiting_.find(key);
      if (w == waiting_.end()) continue;
      std::erase(w->second, waiter.get());
      if (w->second.empty()) waiting_.erase(w);
    }
  }
  pending_ -= it->second.size();
  waits_of_.erase(it);
  return true;
}

void KvState::Watch(const std::string& key, StoreListener* listener) {
  watchers_[key].push_back(listener);
  watched_by_[listener].push_back(key);
}

void KvState::Forget(StoreListener* listener) {
  CancelWaits(listener);
  auto it = watched_by_.find(listener);
  if (it == watched_by_.end()) return;
  for (const auto& key : it->second) {
    auto w = watchers_.find(key);
    if (w == watchers_.end()) continue;
    EraseOne(w->second, listener);
    if (w->second.empty()) watchers_.erase(w);
  }
  watched_by_.erase(it);
}

void KvState::Notify(WatchEvent event, const std::string& key, std::string_view old_value,
                     std::string_view new_value) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  for (StoreListener* l : it->second) l->OnWatchEvent(event, key, old_value, new_value);
}

std::size_t KvState::held_by(const StoreListener* listener) const {
  auto* key = const_cast<StoreListener*>(listener);
  std::size_t n = 0;
  if (auto w = waits_of_.find(key); w != waits_of_.end()) n += w->second.size();
  if (auto w = watched_by_.find(key); w != watched_by_.end()) n += w->second.size();
  return n;
}

}  // namespace crun
