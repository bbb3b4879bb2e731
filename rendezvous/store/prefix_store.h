// PrefixStore: a namespace inside another store. Every key becomes "<prefix>/<key>", as in
// c10d's PrefixStore, so nested prefixes and stock PyTorch clients agree on key names.
// NumKeys counts the whole underlying store (as c10d does); ListKeys returns only this
// namespace's keys, without the prefix. Thread safety is the underlying store's.
#pragma once

#include <memory>

#include "rendezvous/store/store.h"

namespace crun {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

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

  const std::string& prefix() const { return prefix_; }

 private:
  std::string Join(std::string_view key) const;
  std::vector<std::string> Join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace crun
