// A process group: collectives among the workers of a job, whatever the backend (Gloo on CPU,
// NCCL on GPU). Buffers are raw memory described by a count and a dtype, so the interface
// needs no tensor library; the libtorch glue passes tensor storage.
//
// Every operation comes in two forms: blocking (returns its Status) and asynchronous (returns
// a Work to wait on or poll). Operations of one group run in the order they were issued, on
// every rank the same order. Each is bounded by a timeout (the group's default, or the one
// given): a peer that died or hangs makes the others return kTimeout or kUnavailable naming
// the operation, the group and the rank, never hang. After such an error the group is broken:
// later operations fail at once, and the ranks still waiting on this one learn of it at once
// too, because a broken group closes its connections. Abort() breaks a group on purpose.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "crun/base/status.h"
#include "crun/rendezvous/store/store.h"

namespace crun::worker {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64 };
enum class ReduceOp { kSum, kAvg, kMin, kMax };

std::size_t SizeOf(DType t);
const char* Name(DType t);
const char* Name(ReduceOp op);

// An operation started asynchronously. Its buffers must stay valid, and untouched by the
// caller, until Test() is true or Wait() has returned.
class Work {
 public:
  virtual ~Work() = default;
  // True once the operation has finished, successfully or not. Never blocks.
  virtual bool Test() = 0;
  // Blocks until the operation has finished (its timeout bounds this) and returns its status.
  // Calling it again returns the same status.
  virtual Status Wait() = 0;
  // GPU backends: makes the CUDA stream `stream` (a cudaStream_t; nullptr: the current
  // device's legacy default stream) wait, on the device, for this operation; the host does
  // not block, and Test()/Wait() still report how it ended. False where the backend cannot
  // (the caller then waits with Wait()).
  virtual bool BlockStream(void* /*stream*/) { return false; }
};
using WorkPtr = std::shared_ptr<Work>;

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // In place: every rank ends with the reduction of every rank's `data`. kAvg needs a floating
  // dtype.
  virtual WorkPtr AllReduceAsync(void* data, std::size_t count, DType dtype, ReduceOp op,
                                 Millis timeout) = 0;
  // In place: every rank ends with `root`'s `data`.
  virtual WorkPtr BroadcastAsync(void* data, std::size_t count, DType dtype, int root,
                                 Millis timeout) = 0;
  // `out` holds size() * count elements: rank r's `in` lands at r * count.
  virtual WorkPtr AllGatherAsync(const void* in, void* out, std::size_t count, DType dtype,
                                 Millis timeout) = 0;
  // `in` holds size() * count elements; rank r's `out` (count elements) receives the reduction
  // of every rank's block r.
  virtual WorkPtr ReduceScatterAsync(const void* in, void* out, std::size_t count, DType dtype,
                                     ReduceOp op, Millis timeout) = 0;
  virtual WorkPtr BarrierAsync(Millis timeout) = 0;

  // GPU backends: the operations issued after this call start, on the device, only once the
  // work queued so far on the CUDA stream `stream` (nullptr: the legacy default stream) is
  // done, so a caller need not synchronise the device before passing memory that kernels are
  // still writing. False where the backend cannot (CPU backends, or NCCL with
  // CRUN_NCCL_STREAM_ORDER=0): the caller then synchronises itself.
  virtual bool FollowStream(void* /*stream*/) { return false; }

  // Breaks the group from any thread: operations not yet finished on this rank return
  // kAborted (the one in flight as soon as the backend lets go of it: at once over shared
  // memory and NCCL; over Gloo's TCP pairs an operation already inside Gloo ends at its own
  // timeout, because Gloo does not wake a receive it has posted), later ones fail at once,
  // and peers waiting on this rank fail at once instead of at their timeout.
  virtual void Abort(const std::string& reason) = 0;

  // Blocking forms, with the given timeout or the group's default.
  Status AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op, Millis timeout) {
    return AllReduceAsync(data, count, dtype, op, timeout)->Wait();
  }
  Status AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
    return AllReduce(data, count, dtype, op, timeout());
  }
  Status Broadcast(void* data, std::size_t count, DType dtype, int root, Millis timeout) {
    return BroadcastAsync(data, count, dtype, root, timeout)->Wait();
  }
  Status Broadcast(void* data, std::size_t count, DType dtype, int root) {
    return Broadcast(data, count, dtype, root, timeout());
  }
  Status AllGather(const void* in, void* out, std::size_t count, DType dtype, Millis timeout) {
    return AllGatherAsync(in, out, count, dtype, timeout)->Wait();
  }
  Status AllGather(const void* in, void* out, std::size_t count, DType dtype) {
    return AllGather(in, out, count, dtype, timeout());
  }
  Status ReduceScatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                       Millis timeout) {
    return ReduceScatterAsync(in, out, count, dtype, op, timeout)->Wait();
  }
  Status ReduceScatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) {
    return ReduceScatter(in, out, count, dtype, op, timeout());
  }
  Status Barrier(Millis timeout) { return BarrierAsync(timeout)->Wait(); }
  Status Barrier() { return Barrier(timeout()); }

  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }

 protected:
  Millis timeout_{300'000};
};

// A Work that is already finished: what an operation refused up front returns.
WorkPtr FinishedWork(Status status);

}  // namespace crun::worker
