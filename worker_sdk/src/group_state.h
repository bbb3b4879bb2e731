// What every backend's group keeps about itself: its name and place for error messages, and
// whether it is broken (by an error, or aborted on purpose). Thread-safe: Abort() may come
// from any thread.
#pragma once

#include <mutex>
#include <string>

#include "crun/worker/process_group.h"

namespace crun::worker {

class GroupState {
 public:
  GroupState(std::string backend, std::string name, int rank, int size)
      : backend_(std::move(backend)), name_(std::move(name)), rank_(rank), size_(size) {}

  // "gloo group 'grads', rank 1 of 4: allreduce of 10 float32 (sum)"
  std::string Where(const std::string& what) const {
    return backend_ + " group '" + name_ + "', rank " + std::to_string(rank_) + " of " +
           std::to_string(size_) + ": " + what;
  }

  // OK while the group is usable; otherwise why not, for operation `what`.
  Status Usable(const std::string& what) const {
    std::lock_guard<std::mutex> l(mu_);
    if (broken_.ok()) return Status::Ok();
    if (aborted_) return Status(broken_.code(), Where(what) + ": " + broken_.message());
    return Status(broken_.code(),
                  Where(what) + ": the group is broken by an earlier error: " + broken_.message());
  }

  // Records the first failure and returns what operation `what` should report. False
  // `first` when the group was already broken (its backend is torn down already).
  Status Break(StatusCode code, const std::string& what, const std::string& detail,
               bool* first = nullptr) {
    std::lock_guard<std::mutex> l(mu_);
    if (first != nullptr) *first = broken_.ok();
    if (aborted_) return Status(broken_.code(), Where(what) + ": " + broken_.message());
    if (broken_.ok()) broken_ = Status(code, Where(what) + ": " + detail);
    return Status(code, Where(what) + ": " + detail);
  }

  // Marks the group aborted; false when it was broken already.
  bool MarkAborted(const std::string& reason) {
    std::lock_guard<std::mutex> l(mu_);
    if (!broken_.ok()) return false;
    broken_ = Aborted("aborted: " + reason);
    aborted_ = true;
    return true;
  }

  // The refusal of an average over integers, or null.
  WorkPtr RefuseIntegerAvg(const std::string& what, DType dtype, ReduceOp op) const {
    if (op != ReduceOp::kAvg || (dtype != DType::kInt32 && dtype != DType::kInt64)) {
      return nullptr;
    }
    return FinishedWork(
        InvalidArgument(Where(what) + ": avg needs a floating dtype, not " + Name(dtype)));
  }

  WorkPtr RefuseRoot(const std::string& what, int root) const {
    if (root >= 0 && root < size_) return nullptr;
    return FinishedWork(
        InvalidArgument(Where(what) + ": root must be in 0.." + std::to_string(size_ - 1)));
  }

 private:
  const std::string backend_;
  const std::string name_;
  const int rank_;
  const int size_;
  mutable std::mutex mu_;
  Status broken_;
  bool aborted_ = false;
};

// Operation names as errors show them.
std::string DescribeReduce(const char* op_name, std::size_t count, DType dtype, ReduceOp op);
std::string DescribeMove(const char* op_name, std::size_t count, DType dtype);

}  // namespace crun::worker
