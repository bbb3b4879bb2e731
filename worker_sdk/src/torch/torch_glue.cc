// The libtorch glue: the only translation unit of the SDK that includes torch headers.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <sstream>
#include <type_traits>

#include "crun/worker/torch.h"

namespace crun::worker {
namespace {

StatusOr<DType> ToDType(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat:
      return DType::kFloat32;
    case torch::kDouble:
      return DType::kFloat64;
    case torch::kHalf:
      return DType::kFloat16;
    case torch::kBFloat16:
      return DType::kBFloat16;
    case torch::kInt:
      return DType::kInt32;
    case torch::kLong:
      return DType::kInt64;
    default:
      return InvalidArgument(std::string("tensors of dtype ") + c10::toString(t) +
                             " cannot be communicated (float32/64, float16, bfloat16, "
                             "int32/64 can)");
  }
}

// Collectives read device memory directly: make sure the kernels that produced it are done.
void SyncIfCuda(const torch::Tensor& t) {
  if (t.is_cuda()) torch::cuda::synchronize(t.device().index());
}

// Whether torch queues work for `t`'s device on that device's default stream (c10's stream 0,
// which is CUDA's legacy default stream), as it does unless the program chose a stream.
bool OnDefaultStream(const torch::Tensor& t) {
  return c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).id() == 0;
}

// The same guarantee without stopping the host where the group can order itself after
// torch's stream on the device (NCCL): the host keeps queueing work while the GPU catches up.
void OrderAfterProducer(ProcessGroup& group, const torch::Tensor& t) {
  if (!t.is_cuda()) return;
  if (OnDefaultStream(t) && group.FollowStream(nullptr)) return;
  torch::cuda::synchronize(t.device().index());
}

}  // namespace

Status BroadcastParameters(ProcessGroup& group, torch::nn::Module& module, int root) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> tensors = module.parameters();
  for (auto& b : module.buffers()) tensors.push_back(b);
  // One flat tensor per (dtype, device), broadcast in one call each.
  std::map<std::pair<int, std::string>, std::vector<torch::Tensor>> groups;
  for (auto& t : tensors) {
    groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  }
  for (auto& [key, members] : groups) {
    auto dtype = ToDType(members.front().scalar_type());
    if (!dtype.ok()) return dtype.status();
    std::vector<torch::Tensor> views;
    for (auto& t : members) views.push_back(t.reshape(-1));
    torch::Tensor flat = torch::cat(views).contiguous();
    SyncIfCuda(flat);
    CRUN_RETURN_IF_ERROR(
        group.Broadcast(flat.data_ptr(), static_cast<std::size_t>(flat.numel()), *dtype, root));
    std::int64_t offset = 0;
    for (auto& t : members) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
  return Status::Ok();
}

struct GradientAverager::State {
  struct Bucket {
    DType dtype;
    torch::Tensor flat;
    std::vector<std::size_t> params;  // indices into `params`
    std::size_t pending = 0;          // gradients still to arrive this step
    WorkPtr work;
  };

  ProcessGroup& group;
  std::vector<torch::Tensor> params;
  std::vector<std::size_t> bucket_of;
  std::vector<std::int64_t> offset_of;
  std::vector<bool> arrived;
  std::vector<Bucket> buckets;
  std::vector<unsigned> hooks;
  std::mutex mu;
  std::size_t next_launch = 0;
  bool repeated_backward = false;
  // The last step's collectives that torch's stream waits for on the device; the next
  // Finish() (or the destructor) reads how they ended.
  std::vector<WorkPtr> on_device;

  explicit State(ProcessGroup& g) : group(g) {}

  // Buckets start strictly in order, on every rank the same: bucket k only after k-1.
  void LaunchReady() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch];
      OrderAfterProducer(group, b.flat);
      b.work = group.AllReduceAsync(b.flat.data_ptr(), static_cast<std::size_t>(b.flat.numel()),
                                    b.dtype, ReduceOp::kAvg, group.timeout());
      ++next_launch;
    }
  }

  void OnGrad(std::size_t i, const torch::Tensor& grad) {
    torch::NoGradGuard no_grad;
    std::lock_guard<std::mutex> l(mu);
    Bucket& b = buckets[bucket_of[i]];
    if (b.work || arrived[i]) {  // a second backward before Finish(): not supported
      repeated_backward = true;
      return;
    }
    b.flat.narrow(0, offset_of[i], params[i].numel()).copy_(grad.reshape(-1));
    arrived[i] = true;
    --b.pending;
    LaunchReady();
  }
};

GradientAverager::GradientAverager(ProcessGroup& group, torch::nn::Module& module,
                                   std::size_t bucket_bytes)
    : state_(std::make_shared<State>(group)) {
  State& s = *state_;
  for (auto& p : module.parameters()) {
    if (p.requires_grad()) s.params.push_back(p);
  }
  s.bucket_of.resize(s.params.size());
  s.offset_of.resize(s.params.size());
  s.arrived.assign(s.params.size(), false);
  // Backward produces the last layers' gradients first: fill buckets from the end, per dtype
  // and device, closing a bucket once it holds `bucket_bytes`.
  std::map<std::pair<int, std::string>, std::size_t> open;  // -> bucket index
  std::vector<std::int64_t> sizes;
  for (std::size_t k = s.params.size(); k-- > 0;) {
    const torch::Tensor& p = s.params[k];
    const std::pair<int, std::string> key{static_cast<int>(p.scalar_type()), p.device().str()};
    auto it = open.find(key);
    if (it == open.end()) {
      auto dtype = ToDType(p.scalar_type());
      if (!dtype.ok()) throw std::invalid_argument(dtype.status().message());
      s.buckets.push_back(State::Bucket{*dtype, {}, {}, 0, nullptr});
      sizes.push_back(0);
      it = open.emplace(key, s.buckets.size() - 1).first;
    }
    const std::size_t b = it->second;
    s.bucket_of[k] = b;
    s.offset_of[k] = sizes[b];
    sizes[b] += p.numel();
    s.buckets[b].params.push_back(k);
    if (static_cast<std::size_t>(sizes[b]) * p.element_size() >= bucket_bytes) open.erase(it);
  }
  for (std::size_t b = 0; b < s.buckets.size(); ++b) {
    const torch::Tensor& first = s.params[s.buckets[b].params.front()];
    s.buckets[b].flat = torch::zeros({sizes[b]}, first.options().requires_grad(false));
    s.buckets[b].pending = s.buckets[b].params.size();
  }
  std::weak_ptr<State> weak = state_;
  for (std::size_t i = 0; i < s.params.size(); ++i) {
    s.hooks.push_back(s.params[i].register_hook([weak, i](torch::Tensor grad) {
      if (auto st = weak.lock()) st->OnGrad(i, grad);
    }));
  }
}

GradientAverager::~GradientAverager() {
  for (std::size_t i = 0; i < state_->params.size(); ++i) {
    state_->params[i].remove_hook(state_->hooks[i]);
  }
  for (auto& b : state_->buckets) {
    if (b.work) (void)b.work->Wait();  // its buffer is ours: let the collective finish first
  }
  for (auto& w : state_->on_device) (void)w->Wait();
}

std::size_t GradientAverager::bucket_count() const { return state_->buckets.size(); }

Status GradientAverager::Finish() {
  State& s = *state_;
  {
    torch::NoGradGuard no_grad;
    std::lock_guard<std::mutex> l(s.mu);
    // Parameters that got no gradient on this rank contribute zeros; then everything starts.
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      if (s.arrived[i]) continue;
      State::Bucket& b = s.buckets[s.bucket_of[i]];
      b.flat.narrow(0, s.offset_of[i], s.params[i].numel()).zero_();
      s.arrived[i] = true;
      --b.pending;
    }
    s.LaunchReady();
  }
  Status first;
  if (s.repeated_backward) {
    first = InvalidArgument(
        "GradientAverager: more than one backward pass before Finish(); "
        "gradient accumulation across backward passes is not supported");
  }
  // The previous step's collectives, which the device waited for, ended long ago unless a
  // peer is gone: their timeout bounds this.
  for (auto& w : s.on_device) {
    Status st = w->Wait();
    if (!st.ok() && first.ok()) first = Status(st.code(), "averaging gradients: " + st.message());
  }
  s.on_device.clear();
  // On a GPU whose group orders itself on the device, torch's stream waits for each bucket
  // there and the host goes on queueing the optimizer's kernels; elsewhere the host waits.
  for (std::size_t k = 0; k < s.buckets.size(); ++k) {
    State::Bucket& b = s.buckets[k];
    if (b.flat.is_cuda() && OnDefaultStream(b.flat) && b.work->BlockStream(nullptr)) {
      s.on_device.push_back(b.work);
      continue;
    }
    Status st = b.work->Wait();
    if (!st.ok() && first.ok()) {
      first = Status(st.code(), "averaging gradient bucket " + std::to_string(k) + " of " +
                                    std::to_string(s.buckets.size()) + ": " + st.message());
    }
  }
  torch::NoGradGuard no_grad;
  std::lock_guard<std::mutex> l(s.mu);
  if (first.ok()) {
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      torch::Tensor& p = s.params[i];
      auto avg = s.buckets[s.bucket_of[i]].flat.narrow(0, s.offset_of[i], p.numel()).view_as(p);
      if (!p.grad().defined()) {
        p.mutable_grad() = avg.clone();
      } else {
        p.mutable_grad().copy_(avg);
      }
    }
  }
  for (auto& b : s.buckets) {
    b.work = nullptr;
    b.pending = b.params.size();
  }
  s.arrived.assign(s.params.size(), false);
  s.next_launch = 0;
  s.repeated_backward = false;
  return first;
}

Status SaveCheckpoint(ProcessGroup& group, CheckpointDir& dir, std::uint64_t step,
                      torch::nn::Module& module, torch::optim::Optimizer* optimizer) {
  return SaveCheckpoint(group.rank(), dir, step, module, optimizer);
}

Status SaveCheckpoint(int rank, CheckpointDir& dir, std::uint64_t step, torch::nn::Module& module,
                      torch::optim::Optimizer* optimizer) {
  if (rank != 0) return Status::Ok();
  return dir.Save(step, [&](std::ostream& out) {
    try {
      torch::serialize::OutputArchive archive;
      module.save(archive);
      if (optimizer != nullptr) {
        torch::serialize::OutputArchive opt;
        optimizer->save(opt);
        archive.write("crun.optimizer", opt);
      }
      archive.save_to(out);
      return Status::Ok();
    } catch (const std::exception& e) {
      return InternalError("serialising checkpoint " + std::to_string(step) + ": " + e.what());
    }
  });
}

StatusOr<std::optional<std::uint64_t>> LoadNewestCheckpoint(CheckpointDir& dir,
                                                            torch::nn::Module& module,
                                                            torch::optim::Optimizer* optimizer,
                                                            std::optional<torch::Device> device) {
  auto newest = dir.Newest();
  if (!newest.ok()) return newest.status();
  if (!newest->has_value()) return std::optional<std::uint64_t>();
  const Checkpoint& c = **newest;
  try {
    torch::serialize::InputArchive archive;
    // c10::optional is not std::optional in every libtorch.
    archive.load_from(c.path, device ? c10::optional<torch::Device>(*device) : c10::nullopt);
    module.load(archive);
    if (optimizer != nullptr) {
      torch::serialize::InputArchive opt;
      archive.read("crun.optimizer", opt);
      optimizer->load(opt);
    }
  } catch (const std::exception& e) {
    return InternalError("loading checkpoint " + c.path + ": " + e.what());
  }
  return std::optional<std::uint64_t>(c.step);
}

namespace {

const char* SnapshotDtype(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat:
      return "float32";
    case torch::kDouble:
      return "float64";
    case torch::kHalf:
      return "float16";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kLong:
      return "int64";
    case torch::kInt:
      return "int32";
    case torch::kShort:
      return "int16";
    case torch::kChar:
      return "int8";
    case torch::kByte:
      return "uint8";
    case torch::kBool:
      return "bool";
    default:
      return nullptr;
  }
}

StatusOr<SnapshotItem> TensorItem(std::string name, const torch::Tensor& t) {
  const char* dtype = SnapshotDtype(t.scalar_type());
  if (dtype == nullptr) {
    return InvalidArgument(name + ": tensors of dtype " + c10::toString(t.scalar_type()) +
                           " cannot be snapshotted");
  }
  SnapshotItem item;
  item.name = std::move(name);
  item.dtype = dtype;
  item.shape.assign(t.sizes().begin(), t.sizes().end());
  item.bytes = static_cast<std::uint64_t>(t.numel()) * t.element_size();
  item.fill = [t](unsigned char* dst) {
    if (t.device().is_cpu() && t.is_contiguous()) {
      std::memcpy(dst, t.data_ptr(), static_cast<std::size_t>(t.numel()) * t.element_size());
    } else {
      torch::from_blob(dst, t.sizes(), t.options().device(torch::kCPU)).copy_(t);
    }
  };
  return item;
}

// Copies item `name` of `s` into `t`, which it must fit exactly.
Status RestoreTensor(const LoadedSnapshot& s, const std::string& name, torch::Tensor t) {
  const snapshot::Item* item = s.Find(name);
  if (item == nullptr)
    return NotFound("the snapshot at step " + std::to_string(s.step) + " has no " + name);
  const char* dtype = SnapshotDtype(t.scalar_type());
  const auto bytes = static_cast<std::uint64_t>(t.numel()) * t.element_size();
  if (dtype == nullptr || item->dtype != dtype || item->bytes != bytes) {
    return InvalidArgument("the snapshot's " + name + " is " + item->dtype + " of " +
                           std::to_string(item->bytes) + " bytes; the model's is " +
                           (dtype ? dtype : "?") + " of " + std::to_string(bytes));
  }
  torch::NoGradGuard ng;
  const unsigned char* data = s.DataOf(name);
  auto from = torch::from_blob(const_cast<unsigned char*>(data), t.sizes(),
                               t.options().device(torch::kCPU));
  t.copy_(from);
  return Status::Ok();
}

// The key of a parameter's state in an optimizer: libtorch 1.x keys it by the TensorImpl's
// address as text, 2.x by the address itself.
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
template <typename Key>
Key KeyOf(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // as c10::guts::to_string writes it (1.x)
    text << static_cast<const void*>(p.unsafeGetTensorImpl());
    return text.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}
OptimizerStateKey ParamKey(const torch::Tensor& p) { return KeyOf<OptimizerStateKey>(p); }

std::vector<torch::Tensor> OptimizerParams(torch::optim::Optimizer& o) {
  std::vector<torch::Tensor> out;
  for (auto& g : o.param_groups()) {
    for (auto& p : g.params()) out.push_back(p);
  }
  return out;
}

}  // namespace

bool FusedSgdStep(torch::optim::SGD& optimizer) {
  torch::NoGradGuard no_grad;
  struct Group {
    const torch::optim::SGDOptions* o;
    std::vector<torch::Tensor> params, grads, bufs;
  };
  std::vector<Group> groups;
  for (auto& group : optimizer.param_groups()) {
    Group& g = groups.emplace_back();
    g.o = &static_cast<const torch::optim::SGDOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      g.params.push_back(p);
      g.grads.push_back(p.grad());
      if (g.o->momentum() == 0) continue;
      const auto it = optimizer.state().find(ParamKey(p));
      if (it == optimizer.state().end()) {
        optimizer.step();  // the first step: SGD makes each buffer from its first gradient
        return false;
      }
      g.bufs.push_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
    }
  }
  for (auto& g : groups) {
    if (g.params.empty()) continue;
    const auto& o = *g.o;
    std::vector<torch::Tensor> d =
        o.weight_decay() != 0 ? at::_foreach_add(g.grads, g.params, o.weight_decay()) : g.grads;
    if (o.momentum() != 0) {
      at::_foreach_mul_(g.bufs, o.momentum());
      at::_foreach_add_(g.bufs, d, 1 - o.dampening());
      d = o.nesterov() ? at::_foreach_add(d, g.bufs, o.momentum()) : g.bufs;
    }
    at::_foreach_add_(g.params, d, -o.lr());
  }
  return true;
}

StatusOr<std::vector<SnapshotItem>> SnapshotItemsOf(torch::nn::Module& module,
                                                    torch::optim::Optimizer* optimizer) {
  std::vector<SnapshotItem> items;
  for (const auto& p : module.named_parameters()) {
    auto item = TensorItem("param/" + p.key(), p.value().detach());
    if (!item.ok()) return item.status();
    items.push_back(std::move(*item));
  }
  for (const auto& b : module.named_buffers()) {
    auto item = TensorItem("buffer/" + b.key(), b.value().detach());
    if (!item.ok()) return item.status();
    items.push_back(std::move(*item));
  }
  if (optimizer == nullptr) return items;
  if (dynamic_cast<torch::optim::SGD*>(optimizer) != nullptr) {
    const auto params = OptimizerParams(*optimizer);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto it = optimizer->state().find(ParamKey(params[i]));
      if (it == optimizer->state().end()) continue;
      const auto& st = static_cast<const torch::optim::SGDParamState&>(*it->second);
      if (!st.momentum_buffer().defined()) continue;
      auto item = TensorItem("sgd.momentum/" + std::to_string(i), st.momentum_buffer());
      if (!item.ok()) return item.status();
      items.push_back(std::move(*item));
    }
    return items;
  }
  try {
    torch::serialize::OutputArchive archive;
    optimizer->save(archive);
    std::ostringstream out;
    archive.save_to(out);
    auto text = std::make_shared<std::string>(out.str());
    SnapshotItem item;
    item.name = "optimizer.archive";
    item.dtype = "bytes";
    item.shape = {static_cast<std::int64_t>(text->size())};
    item.bytes = text->size();
    item.fill = [text](unsigned char* dst) { std::memcpy(dst, text->data(), text->size()); };
    items.push_back(std::move(item));
  } catch (const std::exception& e) {
    return InternalError(std::string("serialising the optimizer: ") + e.what());
  }
  return items;
}

Status RestoreSnapshot(const LoadedSnapshot& s, torch::nn::Module& module,
                       torch::optim::Optimizer* optimizer) {
  for (auto& p : module.named_parameters()) {
    CRUN_RETURN_IF_ERROR(RestoreTensor(s, "param/" + p.key(), p.value()));
  }
  for (auto& b : module.named_buffers()) {
    CRUN_RETURN_IF_ERROR(RestoreTensor(s, "buffer/" + b.key(), b.value()));
  }
  if (optimizer == nullptr) return Status::Ok();
  if (dynamic_cast<torch::optim::SGD*>(optimizer) != nullptr) {
    const auto params = OptimizerParams(*optimizer);
    optimizer->state().clear();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string name = "sgd.momentum/" + std::to_string(i);
      if (s.Find(name) == nullptr) continue;
      auto buf = torch::empty_like(params[i]);
      CRUN_RETURN_IF_ERROR(RestoreTensor(s, name, buf));
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(buf);
      optimizer->state()[ParamKey(params[i])] = std::move(st);
    }
    return Status::Ok();
  }
  const snapshot::Item* item = s.Find("optimizer.archive");
  if (item == nullptr) return NotFound("the snapshot has no optimizer.archive");
  try {
    const auto* data = reinterpret_cast<const char*>(s.DataOf("optimizer.archive"));
    torch::serialize::InputArchive archive;
    archive.load_from(data, static_cast<std::size_t>(item->bytes));
    optimizer->load(archive);
  } catch (const std::exception& e) {
    return InternalError(std::string("loading the optimizer from the snapshot: ") + e.what());
  }
  return Status::Ok();
}

}  // namespace crun::worker
