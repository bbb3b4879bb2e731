#include "rendezvous/store/prefix_store.h"

namespace crun {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  timeout_ = base_->timeout();
}

std::string PrefixStore::Join(std::string_view key) const {
  std::string out;
  out.reserve(prefix_.size() + 1 + key.size());
  out.append(prefix_).append("/").append(key);
  return out;
}

std::vector<std::string> PrefixStore::Join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(Join(key));
  return out;
}

Status PrefixStore::Set(std::string_view key, std::string_view value) {
  return base_->Set(Join(key), value);
}
// Blocking reads wait with this store's own timeout first, then read without blocking.
StatusOr<std::string> PrefixStore::Get(std::string_view key) {
  std::string full = Join(key);
  CRUN_RETURN_IF_ERROR(base_->Wait({full}, timeout_));
  return base_->Get(full);
}
StatusOr<std::string> PrefixStore::CompareSet(std::string_view key, std::string_view expected,
                                              std::string_view desired) {
  return base_->CompareSet(Join(key), expected, desired);
}
StatusOr<std::int64_t> PrefixStore::Add(std::string_view key, std::int64_t delta) {
  return base_->Add(Join(key), delta);
}
StatusOr<bool> PrefixStore::Check(const std::vector<std::string>& keys) {
  return base_->Check(Join(keys));
}
Status PrefixStore::Wait(const std::vector<std::string>& keys, Millis timeout) {
  return base_->Wait(Join(keys), timeout);
}
StatusOr<std::int64_t> PrefixStore::NumKeys() { return base_->NumKeys(); }
StatusOr<bool> PrefixStore::DeleteKey(std::string_view key) { return base_->DeleteKey(Join(key)); }
Status PrefixStore::Append(std::string_view key, std::string_view value) {
  return base_->Append(Join(key), value);
}
StatusOr<std::vector<std::string>> PrefixStore::MultiGet(const std::vector<std::string>& keys) {
  auto full = Join(keys);
  CRUN_RETURN_IF_ERROR(base_->Wait(full, timeout_));
  return base_->MultiGet(full);
}
Status PrefixStore::MultiSet(const std::vector<std::string>& keys,
                             const std::vector<std::string>& values) {
  return base_->MultiSet(Join(keys), values);
}
Status PrefixStore::QueuePush(std::string_view key, std::string_view value) {
  return base_->QueuePush(Join(key), value);
}
StatusOr<std::string> PrefixStore::QueuePop(std::string_view key, bool block) {
  std::string full = Join(key);
  if (block) CRUN_RETURN_IF_ERROR(base_->Wait({full}, timeout_));
  return base_->QueuePop(full, false);
}
StatusOr<std::int64_t> PrefixStore::QueueLen(std::string_view key) {
  return base_->QueueLen(Join(key));
}
StatusOr<std::vector<std::string>> PrefixStore::ListKeys() {
  auto all = base_->ListKeys();
  if (!all.ok()) return all.status();
  const std::string head = prefix_ + "/";
  std::vector<std::string> mine;
  for (auto& key : *all) {
    if (key.starts_with(head)) mine.push_back(key.substr(head.size()));
  }
  return mine;
}
Status PrefixStore::Barrier(std::string_view key, std::int64_t world_size, Millis timeout) {
  return base_->Barrier(Join(key), world_size, timeout);
}

}  // namespace crun
