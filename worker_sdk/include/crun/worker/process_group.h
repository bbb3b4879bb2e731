// A process group: collectives among the workers of a job, whatever the backend (Gloo on CPU,
// NCCL on GPU). Buffers are raw memory described by a count and a dtype, so the interface
// needs no tensor library; the libtorch glue passes tensor storage.
//
// Every operation is bounded by a timeout (the group's default, or the one given): a peer that
// died or hangs makes the others return kTimeout or kUnavailable naming the operation and the
// rank, never hang. After such an error the group is broken: later operations fail at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "rendezvous/store/status.h"
#include "rendezvous/store/store.h"

namespace crun::worker {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64 };
enum class ReduceOp { kSum, kAvg, kMin, kMax };

std::size_t SizeOf(DType t);
const char* Name(DType t);
const char* Name(ReduceOp op);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // In place: every rank ends with the reduction of every rank's `data`. kAvg needs a floating
  // dtype.
  virtual Status AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                           Millis timeout) = 0;
  // In place: every rank ends with `root`'s `data`.
  virtual Status Broadcast(void* data, std::size_t count, DType dtype, int root,
                           Millis timeout) = 0;
  // `out` holds size() * count elements: rank r's `in` lands at r * count.
  virtual Status AllGather(const void* in, void* out, std::size_t count, DType dtype,
                           Millis timeout) = 0;
  virtual Status Barrier(Millis timeout) = 0;

  Status AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
    return AllReduce(data, count, dtype, op, timeout());
  }
  Status Broadcast(void* data, std::size_t count, DType dtype, int root) {
    return Broadcast(data, count, dtype, root, timeout());
  }
  Status AllGather(const void* in, void* out, std::size_t count, DType dtype) {
    return AllGather(in, out, count, dtype, timeout());
  }
  Status Barrier() { return Barrier(timeout()); }

  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }

 protected:
  Millis timeout_{300'000};
};

}  // namespace crun::worker
