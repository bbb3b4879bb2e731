// train's model: CIFAR ResNets (resnet18 for GPUs, resnet-small for CPUs) and the autocast
// scope for mixed precision. Header-only, included by train.cc alone: libtorch stays in one
// translation unit.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <string>
#include <vector>

#include "train/cifar.h"

namespace crun::train {

// Two 3x3 convolutions with batch norm and a shortcut (1x1 convolution where the shape changes).
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int in, int out, int stride)
      : conv1(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
        bn1(out),
        conv2(torch::nn::Conv2dOptions(out, out, 3).stride(1).padding(1).bias(false)),
        bn2(out) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (stride != 1 || in != out) {
      shortcut =
          register_module("shortcut",
                          torch::nn::Sequential(
                              torch::nn::Conv2d(
                                  torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                              torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (shortcut.is_empty() ? x : shortcut->forward(x)));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

// CIFAR ResNets: a 3x3 stem (no max-pool: the images are 32x32), stages of basic blocks, global
// average pooling, one linear layer. resnet18: widths 64-512, two blocks per stage (11.2 M
// parameters). resnet-small: widths 16-64, one block per stage, for CPUs.
struct ResNetImpl : torch::nn::Module {
  ResNetImpl(const std::vector<int>& widths, int blocks_per_stage)
      : stem(torch::nn::Conv2dOptions(3, widths[0], 3).stride(1).padding(1).bias(false)),
        bn(widths[0]) {
    register_module("stem", stem);
    register_module("bn", bn);
    int in = widths[0];
    for (std::size_t s = 0; s < widths.size(); ++s) {
      for (int b = 0; b < blocks_per_stage; ++b) {
        const int stride = (s > 0 && b == 0) ? 2 : 1;
        blocks->push_back(BasicBlock(in, widths[s], stride));
        in = widths[s];
      }
    }
    register_module("blocks", blocks);
    fc = register_module("fc", torch::nn::Linear(in, kClasses));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn(stem(x)));
    x = blocks->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d bn;
  torch::nn::Sequential blocks;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

inline ResNet MakeModel(const std::string& name) {
  if (name == "resnet18") return ResNet(std::vector<int>{64, 128, 256, 512}, 2);
  return ResNet(std::vector<int>{16, 32, 64}, 1);
}

// ------------------------------------------------------------------------------ autocast

// Autocast on the GPU; the C++ API changed in PyTorch 2.4.
class AutocastScope {
 public:
  AutocastScope(bool on, at::ScalarType dtype) : on_(on) {
    if (!on_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
#else
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
#endif
  }
  ~AutocastScope() {
    if (!on_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, false);
#else
    at::autocast::set_enabled(false);
#endif
    at::autocast::clear_cache();
  }

 private:
  bool on_;
};

}  // namespace crun::train
