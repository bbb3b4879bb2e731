// The NCCL backend. Communicators are created non-blocking, so no NCCL call can hold a thread
// hostage: every call returns at once, and the waits (creation, enqueue, completion) are
// polled against a deadline here. On a deadline, an asynchronous NCCL error or Abort() the
// communicator is aborted with ncclCommAbort, which also frees the GPU of its kernels.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "crun/worker/nccl.h"
#include "worker_sdk/src/group_state.h"
#include "worker_sdk/src/step_clock.h"

namespace crun::worker {
namespace {

using Clock = std::chrono::steady_clock;
// How often a wait looks again: short next to any collective worth waiting for, long next to
// the cost of a query (a few microseconds).
constexpr auto kPollInterval = std::chrono::microseconds(50);
constexpr auto kSpinFor = std::chrono::milliseconds(2);

std::string CudaText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

std::string NcclText(ncclResult_t r, ncclComm_t comm) {
  std::string text = std::string(ncclGetErrorString(r));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += ": " + std::string(last);
  return text;
}

ncclDataType_t ToNccl(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// Makes `device` the calling thread's current device for a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && status_ == cudaSuccess) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// One communicator, its stream and its state; shared by the group and its pending work.
class Comm : public std::enable_shared_from_this<Comm> {
 public:
  Comm(std::shared_ptr<GroupState> state, ncclComm_t comm, cudaStream_t stream, int* scratch,
       int device, Millis timeout)
      : state_(std::move(state)),
        comm_(comm),
        stream_(stream),
        scratch_(scratch),
        device_(device),
        timeout_(timeout) {}

  ~Comm() {
    DeviceGuard guard(device_);
    if (comm_ != nullptr) {
      // A clean end: finalize (flushes queued work), then destroy; within the group's
      // timeout, else abort.
      const auto deadline = Clock::now() + timeout_;
      ncclResult_t r = ncclCommFinalize(comm_);
      while (r == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(kPollInterval);
        ncclCommGetAsyncError(comm_, &r);
      }
      if (r == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    if (follow_event_ != nullptr) cudaEventDestroy(follow_event_);
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  int device() const { return device_; }

  // The group's stream waits, on the device, for the work queued so far on `producer`.
  bool FollowStream(cudaStream_t producer) {
    if (!StreamOrderOn()) return false;
    DeviceGuard guard(device_);
    if (guard.status() != cudaSuccess) return false;
    std::lock_guard<std::mutex> l(mu_);
    cudaError_t e = cudaSuccess;
    if (follow_event_ == nullptr) {
      e = cudaEventCreateWithFlags(&follow_event_, cudaEventDisableTiming);
    }
    if (e == cudaSuccess) e = cudaEventRecord(follow_event_, producer);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, follow_event_, 0);
    return e == cudaSuccess;
  }

  // `consumer` waits, on the device, for the work that `done` was recorded after.
  bool BlockStream(cudaStream_t consumer, cudaEvent_t done) const {
    if (!StreamOrderOn()) return false;
    DeviceGuard guard(device_);
    return guard.status() == cudaSuccess && cudaStreamWaitEvent(consumer, done, 0) == cudaSuccess;
  }

  // CRUN_NCCL_STREAM_ORDER=0 turns device-side ordering off (callers synchronise on the host
  // instead), to measure what it saves.
  static bool StreamOrderOn() {
    static const bool on = [] {
      const char* v = std::getenv("CRUN_NCCL_STREAM_ORDER");
      return v == nullptr || std::string(v) != "0";
    }();
    return on;
  }
  int* scratch() const { return scratch_; }

  // Records the first failure and aborts the communicator, once.
  Status Fail(StatusCode code, const std::string& what, const std::string& detail) {
    bool first = false;
    Status s = state_->Break(code, what, detail, &first);
    if (first) AbortComm();
    return s;
  }

  void AbortComm() {
    std::lock_guard<std::mutex> l(mu_);
    if (comm_ == nullptr) return;
    DeviceGuard guard(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Queues one NCCL call on the stream and returns the Work that tracks it.
  template <typename Call>
  WorkPtr Enqueue(const std::string& what, std::size_t count, Millis timeout, Call call);

  // Whether the work recorded by `done` has finished; on an error or past `deadline`, the
  // group fails and `status` says why. Never blocks.
  bool Poll(const std::string& what, cudaEvent_t done, Clock::time_point deadline, Millis timeout,
            Status* status) {
    Status usable = state_->Usable(what);
    if (!usable.ok()) {
      *status = usable;
      return true;
    }
    const cudaError_t e = cudaEventQuery(done);
    if (e == cudaSuccess) {
      *status = Status::Ok();
      return true;
    }
    if (e != cudaErrorNotReady) {
      *status = Fail(StatusCode::kInternal, what, "CUDA: " + CudaText(e));
      return true;
    }
    ncclResult_t async = ncclSuccess;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (comm_ != nullptr) ncclCommGetAsyncError(comm_, &async);
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      *status = Fail(StatusCode::kUnavailable, what, "NCCL: " + NcclText(async, nullptr));
      return true;
    }
    if (Clock::now() >= deadline) {
      *status = Fail(StatusCode::kTimeout, what,
                     "not finished after " + std::to_string(timeout.count()) +
                         " ms (a peer is slow, hung or gone); the communicator is aborted");
      return true;
    }
    return false;
  }

 private:
  const std::shared_ptr<GroupState> state_;
  std::mutex mu_;  // guards comm_: every NCCL call on it, and its abort
  ncclComm_t comm_;
  cudaStream_t stream_;
  cudaEvent_t follow_event_ = nullptr;  // FollowStream's marker on the producer's stream
  int* scratch_;
  const int device_;
  const Millis timeout_;
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Comm> comm, std::string what, cudaEvent_t done, Millis timeout)
      : comm_(std::move(comm)),
        what_(std::move(what)),
        done_event_(done),
        deadline_(Clock::now() + timeout),
        timeout_(timeout) {}
  ~NcclWork() override { cudaEventDestroy(done_event_); }

  bool Test() override {
    std::lock_guard<std::mutex> l(mu_);
    if (!finished_) finished_ = comm_->Poll(what_, done_event_, deadline_, timeout_, &status_);
    return finished_;
  }

  // Spins (yielding) for the first kSpinFor, where small operations finish, then polls at
  // kPollInterval so long ones do not hold a core.
  Status Wait() override {
    internal::CollectiveWaitTimer timed;
    std::lock_guard<std::mutex> l(mu_);
    const auto spin_until = Clock::now() + kSpinFor;
    while (!finished_) {
      finished_ = comm_->Poll(what_, done_event_, deadline_, timeout_, &status_);
      if (finished_) break;
      if (Clock::now() < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kPollInterval);
      }
    }
    return status_;
  }

  bool BlockStream(void* stream) override {
    return comm_->BlockStream(static_cast<cudaStream_t>(stream), done_event_);
  }

 private:
  std::shared_ptr<Comm> comm_;
  const std::string what_;
  cudaEvent_t done_event_;
  const Clock::time_point deadline_;
  const Millis timeout_;
  std::mutex mu_;
  bool finished_ = false;
  Status status_;
};

template <typename Call>
WorkPtr Comm::Enqueue(const std::string& what, std::size_t count, Millis timeout, Call call) {
  Status usable = state_->Usable(what);
  if (!usable.ok()) return FinishedWork(usable);
  if (count == 0) return FinishedWork(Status::Ok());
  const auto deadline = Clock::now() + timeout;
  DeviceGuard guard(device_);
  if (guard.status() != cudaSuccess) {
    return FinishedWork(
        Fail(StatusCode::kInternal, what,
             "cudaSetDevice(" + std::to_string(device_) + "): " + CudaText(guard.status())));
  }
  std::unique_lock<std::mutex> l(mu_);
  if (comm_ == nullptr) return FinishedWork(state_->Usable(what));
  ncclResult_t r = call(comm_, stream_);
  // A non-blocking communicator may still be queueing the call: wait for it to be queued.
  while (r == ncclInProgress) {
    if (Clock::now() >= deadline) {
      l.unlock();
      return FinishedWork(
          Fail(StatusCode::kTimeout, what,
               "NCCL could not queue it within " + std::to_string(timeout.count()) + " ms"));
    }
    l.unlock();
    std::this_thread::sleep_for(kPollInterval);
    l.lock();
    if (comm_ == nullptr) return FinishedWork(state_->Usable(what));
    ncclCommGetAsyncError(comm_, &r);
  }
  if (r != ncclSuccess) {
    const std::string text = NcclText(r, comm_);
    l.unlock();
    return FinishedWork(Fail(StatusCode::kUnavailable, what, "NCCL: " + text));
  }
  cudaEvent_t done = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(done, stream_);
  l.unlock();
  if (e != cudaSuccess) {
    if (done != nullptr) cudaEventDestroy(done);
    return FinishedWork(Fail(StatusCode::kInternal, what, "CUDA event: " + CudaText(e)));
  }
  return std::make_shared<NcclWork>(shared_from_this(), what, done, timeout);
}

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(std::shared_ptr<GroupState> state, int rank, int size, std::shared_ptr<Comm> comm)
      : state_(std::move(state)), rank_(rank), size_(size), comm_(std::move(comm)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  WorkPtr AllReduceAsync(void* data, std::size_t count, DType dtype, ReduceOp op,
                         Millis timeout) override {
    const std::string what = DescribeReduce("allreduce", count, dtype, op);
    if (auto refused = state_->RefuseIntegerAvg(what, dtype, op)) return refused;
    return comm_->Enqueue(what, count, timeout, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(data, data, count, ToNccl(dtype), ToNccl(op), c, s);
    });
  }

  WorkPtr BroadcastAsync(void* data, std::size_t count, DType dtype, int root,
                         Millis timeout) override {
    const std::string what =
        DescribeMove("broadcast", count, dtype) + " from rank " + std::to_string(root);
    if (auto refused = state_->RefuseRoot(what, root)) return refused;
    return comm_->Enqueue(what, count, timeout, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(data, data, count, ToNccl(dtype), root, c, s);
    });
  }

  WorkPtr AllGatherAsync(const void* in, void* out, std::size_t count, DType dtype,
                         Millis timeout) override {
    return comm_->Enqueue(DescribeMove("allgather", count, dtype), count, timeout,
                          [&](ncclComm_t c, cudaStream_t s) {
                            return ncclAllGather(in, out, count, ToNccl(dtype), c, s);
                          });
  }

  WorkPtr ReduceScatterAsync(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                             Millis timeout) override {
    const std::string what = DescribeReduce("reduce-scatter", count, dtype, op) + " per rank";
    if (auto refused = state_->RefuseIntegerAvg(what, dtype, op)) return refused;
    return comm_->Enqueue(what, count, timeout, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(in, out, count, ToNccl(dtype), ToNccl(op), c, s);
    });
  }

  WorkPtr BarrierAsync(Millis timeout) override {
    int* scratch = comm_->scratch();
    return comm_->Enqueue("barrier", 1, timeout, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, c, s);
    });
  }

  void Abort(const std::string& reason) override {
    if (state_->MarkAborted(reason)) comm_->AbortComm();
  }

  bool FollowStream(void* stream) override {
    return comm_->FollowStream(static_cast<cudaStream_t>(stream));
  }

 private:
  std::shared_ptr<GroupState> state_;  // shared with the Comm, which pending Work holds
  const int rank_;
  const int size_;
  std::shared_ptr<Comm> comm_;
};

}  // namespace

std::string NcclVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // Since 2.9: major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

namespace {

// The steps of MakeNcclGroup. Each error begins with `where` (the group, rank and size).

// The GPU this rank uses: the one asked for, else local rank modulo the visible ones.
StatusOr<int> PickDevice(const std::string& where, const WorkerEnv& env, int asked) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return Status(StatusCode::kUnavailable,
                  where + "no CUDA device visible (CUDA_VISIBLE_DEVICES=" +
                      (visible != nullptr ? visible : "unset") +
                      "): " + (e != cudaSuccess ? CudaText(e) : std::string("0 devices")));
  }
  const int device = asked >= 0 ? asked : env.local_rank % devices;
  if (device >= devices) {
    return Status(StatusCode::kInvalidArgument, where + "device " + std::to_string(device) +
                                                    " does not exist (" + std::to_string(devices) +
                                                    " visible)");
  }
  return device;
}

// The unique id: made by rank 0, read by the others from the job's store under `key`.
StatusOr<ncclUniqueId> ShareUniqueId(const std::string& where, Context& context,
                                     const std::string& key, Millis timeout) {
  ncclUniqueId id{};
  if (context.env().rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return Status(StatusCode::kUnavailable, where + "ncclGetUniqueId: " + NcclText(r, nullptr));
    }
    CRUN_RETURN_IF_ERROR(
        context.store().Set(key, std::string_view(id.internal, sizeof(id.internal))));
    return id;
  }
  CRUN_RETURN_IF_ERROR(context.store().Wait({key}, timeout));
  auto bytes = context.store().Get(key);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() != sizeof(id.internal)) {
    return Status(StatusCode::kProtocol, where + "the unique id under " + key + " has " +
                                             std::to_string(bytes->size()) + " bytes, not " +
                                             std::to_string(sizeof(id.internal)));
  }
  std::copy(bytes->begin(), bytes->end(), id.internal);
  return id;
}

// A non-blocking communicator, polled until it is ready or `o.timeout` has passed (then
// aborted).
StatusOr<ncclComm_t> InitComm(const std::string& where, const WorkerEnv& env, const NcclOptions& o,
                              const ncclUniqueId& id, int device) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, env.world_size, id, env.rank, &config);
  const auto deadline = Clock::now() + o.timeout;
  while (r == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::sleep_for(kPollInterval);
    ncclCommGetAsyncError(comm, &r);
  }
  if (r == ncclSuccess) return comm;
  const std::string text = r == ncclInProgress
                               ? "not ready after " + std::to_string(o.timeout.count()) +
                                     " ms: do all " + std::to_string(env.world_size) +
                                     " ranks create group '" + o.name + "'?"
                               : NcclText(r, comm);
  if (comm != nullptr) ncclCommAbort(comm);
  return Status(r == ncclInProgress ? StatusCode::kTimeout : StatusCode::kUnavailable,
                where + "creating the communicator on GPU " + std::to_string(device) + ": " + text);
}

// The group's stream and its one-int scratch (the barrier's operand), around `comm`; on an
// error `comm` is aborted and nothing is left allocated.
StatusOr<std::shared_ptr<Comm>> WrapComm(const std::string& where,
                                         std::shared_ptr<GroupState> state, ncclComm_t comm,
                                         int device, Millis timeout) {
  cudaStream_t stream = nullptr;
  int* scratch = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&scratch), sizeof(int));
  if (e != cudaSuccess) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    ncclCommAbort(comm);
    return Status(StatusCode::kInternal, where + "stream or scratch on GPU " +
                                             std::to_string(device) + ": " + CudaText(e));
  }
  return std::make_shared<Comm>(std::move(state), comm, stream, scratch, device, timeout);
}

}  // namespace

StatusOr<std::unique_ptr<ProcessGroup>> MakeNcclGroup(Context& context, const NcclOptions& o) {
  const WorkerEnv& env = context.env();
  auto state = std::make_shared<GroupState>("nccl", o.name, env.rank, env.world_size);
  const std::string where = state->Where("");
  CRUN_ASSIGN_OR_RETURN(const int device, PickDevice(where, env, o.device));
  DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) {
    return Status(StatusCode::kInternal, where + "cudaSetDevice(" + std::to_string(device) +
                                             "): " + CudaText(guard.status()));
  }
  const std::string key = context.round_prefix() + "nccl/" + o.name + "/unique_id";
  CRUN_ASSIGN_OR_RETURN(const ncclUniqueId id, ShareUniqueId(where, context, key, o.timeout));
  CRUN_ASSIGN_OR_RETURN(ncclComm_t comm, InitComm(where, env, o, id, device));
  CRUN_ASSIGN_OR_RETURN(auto c, WrapComm(where, state, comm, device, o.timeout));
  auto group = std::make_unique<NcclGroup>(state, env.rank, env.world_size, std::move(c));
  group->set_timeout(o.timeout);
  return std::unique_ptr<ProcessGroup>(std::move(group));
}

}  // namespace crun::worker
