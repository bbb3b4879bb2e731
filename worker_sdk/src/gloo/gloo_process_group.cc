// The Gloo backend. Gloo reports failures by throwing; every call into it is wrapped here and
// turned into a Status that names the operation, the rank and the group.
#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "base/host_addresses.h"
#include "base/socket.h"
#include "crun/worker/env_names.h"
#include "crun/worker/gloo.h"
#include "worker_sdk/src/group_state.h"
#include "worker_sdk/src/reduce.h"
#include "worker_sdk/src/serial_executor.h"
#include "worker_sdk/src/shm_channel.h"

namespace crun::worker {
namespace {

// Gloo's view of the job's store: keys under the group's prefix. Gloo expects exceptions.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(crun::Store& store, std::string prefix, Millis timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(prefix_ + key, std::string_view(data.data(), data.size())));
  }
  std::vector<char> get(const std::string& key) override {
    Check(store_.Wait({prefix_ + key}, timeout_));
    auto v = store_.Get(prefix_ + key);
    Check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    Check(store_.Wait(full, t));
  }

 private:
  static void Check(const Status& s) {
    if (!s.ok()) throw std::runtime_error(s.message());
  }
  crun::Store& store_;
  std::string prefix_;
  Millis timeout_;
};

// Slot prefix of crun's own ring reduce-scatter; Gloo's collectives use small prefixes.
constexpr std::uint8_t kReduceScatterSlotPrefix = 0x7c;

using Deadline = ShmChannel::Deadline;

Deadline DeadlineAfter(Millis timeout) { return std::chrono::steady_clock::now() + timeout; }

// Every operation goes through shared memory when all ranks share a host (shm_channel.h) and
// over Gloo's TCP pairs otherwise.
class GlooGroup final : public ProcessGroup {
 public:
  GlooGroup(std::shared_ptr<gloo::rendezvous::Context> ctx, const std::string& name,
            std::unique_ptr<ShmChannel> shm)
      : ctx_(std::move(ctx)), state_("gloo", name, ctx_->rank, ctx_->size), shm_(std::move(shm)) {
    executor_.set_owner(state_.Where("group"));
  }

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::string backend() const override { return "gloo"; }

  WorkPtr AllReduceAsync(void* data, std::size_t count, DType dtype, ReduceOp op,
                         Millis timeout) override {
    std::string what = DescribeReduce("allreduce", count, dtype, op);
    if (auto refused = state_.RefuseIntegerAvg(what, dtype, op)) return refused;
    return Submit(std::move(what), count, [=, this] {
      if (shm_) return shm_->AllReduce(data, count, dtype, op, DeadlineAfter(timeout));
      gloo::AllreduceOptions o(ctx_);
      o.setTimeout(timeout);
      o.setTag(NextTag());
      // Gloo needs the element size; the reduction itself is ours, per dtype.
      switch (SizeOf(dtype)) {
        case 2:
          o.setInput(static_cast<std::uint16_t*>(data), count);
          o.setOutput(static_cast<std::uint16_t*>(data), count);
          break;
        case 4:
          o.setInput(static_cast<std::uint32_t*>(data), count);
          o.setOutput(static_cast<std::uint32_t*>(data), count);
          break;
        default:
          o.setInput(static_cast<std::uint64_t*>(data), count);
          o.setOutput(static_cast<std::uint64_t*>(data), count);
          break;
      }
      o.setReduceFunction(ReduceFunc(dtype, op));
      gloo::allreduce(o);
      if (op == ReduceOp::kAvg) Scale(data, count, dtype, 1.0 / size());
      return Status::Ok();
    });
  }

  WorkPtr BroadcastAsync(void* data, std::size_t count, DType dtype, int root,
                         Millis timeout) override {
    std::string what =
        DescribeMove("broadcast", count, dtype) + " from rank " + std::to_string(root);
    if (auto refused = state_.RefuseRoot(what, root)) return refused;
    return Submit(std::move(what), count, [=, this] {
      if (shm_) return shm_->Broadcast(data, count * SizeOf(dtype), root, DeadlineAfter(timeout));
      gloo::BroadcastOptions o(ctx_);
      o.setTimeout(timeout);
      o.setTag(NextTag());
      o.setRoot(root);
      auto* bytes = static_cast<std::uint8_t*>(data);
      if (rank() == root) o.setInput(bytes, count * SizeOf(dtype));
      o.setOutput(bytes, count * SizeOf(dtype));
      gloo::broadcast(o);
      return Status::Ok();
    });
  }

  WorkPtr AllGatherAsync(const void* in, void* out, std::size_t count, DType dtype,
                         Millis timeout) override {
    return Submit(DescribeMove("allgather", count, dtype), count, [=, this] {
      if (shm_) return shm_->AllGather(in, out, count * SizeOf(dtype), DeadlineAfter(timeout));
      gloo::AllgatherOptions o(ctx_);
      o.setTimeout(timeout);
      o.setTag(NextTag());
      const std::size_t bytes = count * SizeOf(dtype);
      // Given no input, Gloo's allgather takes this rank's part from its own slot of the
      // output: put it there first.
      auto* dst = static_cast<std::uint8_t*>(out);
      std::memmove(dst + static_cast<std::size_t>(rank()) * bytes, in, bytes);
      o.setOutput(dst, bytes * static_cast<std::size_t>(size()));
      gloo::allgather(o);
      return Status::Ok();
    });
  }

  WorkPtr ReduceScatterAsync(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                             Millis timeout) override {
    std::string what = DescribeReduce("reduce-scatter", count, dtype, op) + " per rank";
    if (auto refused = state_.RefuseIntegerAvg(what, dtype, op)) return refused;
    return Submit(std::move(what), count, [=, this] {
      if (shm_) return shm_->ReduceScatter(in, out, count, dtype, op, DeadlineAfter(timeout));
      RingReduceScatter(in, out, count, dtype, op, timeout);
      if (op == ReduceOp::kAvg) Scale(out, count, dtype, 1.0 / size());
      return Status::Ok();
    });
  }

  WorkPtr BarrierAsync(Millis timeout) override {
    return Submit("barrier", 1, [=, this] {
      if (shm_) return shm_->Barrier(DeadlineAfter(timeout));
      gloo::BarrierOptions o(ctx_);
      o.setTimeout(timeout);
      o.setTag(NextTag());
      gloo::barrier(o);
      return Status::Ok();
    });
  }

  void Abort(const std::string& reason) override {
    if (state_.MarkAborted(reason)) TearDown();
  }

  // Whether operations go through shared memory (tests and benchmarks ask).
  bool uses_shared_memory() const { return shm_ != nullptr; }

 private:
  // Queues `f` behind the group's earlier operations. It runs unless the group is broken by
  // then; a failure (a Gloo exception or a shared-memory error) breaks the group and tears
  // down its transports, so the peers waiting on this rank fail now rather than at their own
  // timeout.
  template <typename F>
  WorkPtr Submit(std::string what, std::size_t count, F f) {
    return executor_.Submit([this, what = std::move(what), count, f = std::move(f)]() {
      CRUN_RETURN_IF_ERROR(state_.Usable(what));
      if (count == 0) return Status::Ok();
      Status failure;
      try {
        failure = f();
        if (failure.ok()) return failure;
      } catch (const std::exception& e) {
        const std::string m = e.what();
        const bool timed_out =
            m.find("Timed out") != std::string::npos || m.find("timed out") != std::string::npos;
        failure = Status(timed_out ? StatusCode::kTimeout : StatusCode::kUnavailable, m);
      }
      bool first = false;
      Status s = state_.Break(failure.code(), what, failure.message(), &first);
      if (first) TearDown();
      return s;
    });
  }

  // Peers waiting on this rank fail at once: the shared-memory channel is marked broken and
  // the TCP connections are closed. (Gloo does not wake a receive this rank itself has
  // already posted: a TCP operation in flight here ends at its timeout; see Abort().)
  void TearDown() {
    if (shm_) shm_->Break();
    ctx_->closeConnections();
  }

  // Ring reduce-scatter over Gloo's unbound buffers: in n-1 steps each rank passes one block
  // to its right neighbour and folds the block from its left one into its own copy, so that
  // rank r ends holding the full reduction of block r. Each rank sends and receives
  // (n-1)/n of the input, the bandwidth optimum.
  void RingReduceScatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                         Millis timeout) {
    const int n = size();
    const int r = rank();
    const std::size_t block = count * SizeOf(dtype);
    const auto* src = static_cast<const std::uint8_t*>(in);
    std::vector<std::uint8_t> acc(src, src + block * static_cast<std::size_t>(n));
    if (n > 1) {
      std::vector<std::uint8_t> incoming(block);
      auto send_buf = ctx_->createUnboundBuffer(acc.data(), acc.size());
      auto recv_buf = ctx_->createUnboundBuffer(incoming.data(), incoming.size());
      const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, NextTag());
      const auto reduce = ReduceFunc(dtype, op);
      const int right = (r + 1) % n;
      const int left = (r + n - 1) % n;
      auto offset = [&](int step_block) {
        return static_cast<std::size_t>((step_block % n + n) % n) * block;
      };
      for (int s = 0; s < n - 1; ++s) {
        send_buf->send(right, slot, offset(r - s - 1), block);
        recv_buf->recv(left, slot, 0, block);
        if (!recv_buf->waitRecv(timeout) || !send_buf->waitSend(timeout)) {
          throw std::runtime_error("reduce-scatter step " + std::to_string(s) + " was aborted");
        }
        std::uint8_t* mine = acc.data() + offset(r - s - 2);
        reduce(mine, mine, incoming.data(), count);
      }
    }
    std::memcpy(out, acc.data() + static_cast<std::size_t>(r) * block, block);
  }

  std::uint32_t NextTag() { return ++tag_; }

  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  GroupState state_;
  std::uint32_t tag_ = 0;            // used on the executor's thread only
  std::unique_ptr<ShmChannel> shm_;  // null: Gloo's TCP pairs carry every operation
  // Last member: destroyed first, so its thread is joined while the rest is still alive.
  SerialExecutor executor_;
};

// Gloo writes to its sockets without MSG_NOSIGNAL: a peer that is gone would kill this process
// with SIGPIPE instead of failing the collective. Ignore it, unless the program installed a
// handler of its own (Python does the same at start-up).
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }
}

}  // namespace

StatusOr<std::unique_ptr<ProcessGroup>> MakeGlooGroup(Context& context, const GlooOptions& o) {
  const WorkerEnv& env = context.env();
  std::string address = o.local_address;
  if (address.empty()) address = LocalAddressToward(env.master_addr, env.master_port);
  if (address.empty()) {
    return Unavailable("rank " + std::to_string(env.rank) + ": no local address reaches " +
                       "MASTER_ADDR " + env.master_addr + " (set GlooOptions.local_address)");
  }
  const std::string where = "gloo group '" + o.name + "', rank " + std::to_string(env.rank) +
                            " of " + std::to_string(env.world_size);
  IgnoreSigpipeUnlessHandled();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(env.rank, env.world_size);
    ctx->setTimeout(o.timeout);
    StoreAdapter store(context.store(), context.round_prefix() + "gloo/" + o.name + "/", o.timeout);
    ctx->connectFullMesh(store, device);
    std::unique_ptr<ShmChannel> shm;
    {
      // Every rank takes part, willing or not, so that all reach the same answer.
      const char* env_shm = std::getenv(crun::env::kCrunGlooShm);
      const bool willing = o.shared_memory && !(env_shm != nullptr && std::string(env_shm) == "0");
      auto connected =
          ShmChannel::Connect(context.store(), context.round_prefix() + "gloo/" + o.name + "/shm/",
                              env.rank, env.world_size, willing, o.timeout);
      if (!connected.ok()) {
        return Status(connected.status().code(),
                      where + ": cannot set up shared memory: " + connected.status().message());
      }
      shm = std::move(connected->channel);  // none: the group's TCP pairs carry everything
    }
    auto group = std::make_unique<GlooGroup>(std::move(ctx), o.name, std::move(shm));
    group->set_timeout(o.timeout);
    return std::unique_ptr<ProcessGroup>(std::move(group));
  } catch (const std::exception& e) {
    return Unavailable(where + ": cannot connect (local address " + address + "): " + e.what());
  }
}

bool GlooUsesSharedMemory(const ProcessGroup& group) {
  const auto* gloo = dynamic_cast<const GlooGroup*>(&group);
  return gloo != nullptr && gloo->uses_shared_memory();
}

}  // namespace crun::worker
