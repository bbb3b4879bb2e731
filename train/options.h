// train's command line (docs/train.md). Parsing needs no libtorch, so tests check it cheaply.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace crun::train {

enum class Device { kCpu, kCuda, kAuto };
enum class Amp { kOff, kBf16, kFp16 };
enum class Schedule { kCosine, kOneCycle };

struct Options {
  std::string data_dir;        // CIFAR-10 binary files; "" with --synthetic: a temp dir
  std::int64_t synthetic = 0;  // >0: generate this many training images (and 1/5 as many test)
  int epochs = 10;
  int batch_size = 128;  // per worker
  double lr = 0.1;       // peak, for a global batch of 128 x world size... as given
  double momentum = 0.9;
  double weight_decay = 5e-4;
  double label_smoothing = 0.1;
  double warmup_epochs = 1.0;
  Schedule schedule = Schedule::kCosine;
  std::string model = "resnet-small";  // resnet-small | resnet18
  Amp amp = Amp::kOff;
  bool channels_last = false;
  Device device = Device::kAuto;
  std::string checkpoint_dir;  // "": no checkpoints
  int checkpoint_every = 1;    // epochs
  int snapshot_every = -1;     // steps, into crun's node memory; -1: 1 on CPU, 50 on a GPU; 0: none
  int eval_every = 1;          // epochs
  std::uint64_t seed = 0;
  int threads = 0;             // 0: cores / LOCAL_WORLD_SIZE
  int loader_threads = 0;      // 0: 1 on CPU, up to 8 on a GPU
  std::string metrics_json;    // "": none
  int log_every = 20;          // steps, for plain (non-terminal) progress lines
  std::int64_t max_steps = 0;  // >0: stop each epoch after this many steps (benchmarks)
  bool help = false;
};

// Parses argv[1..]; kInvalidArgument naming the option and its value ("--epochs 'ten' is not
// valid: expected an integer from 1").
StatusOr<Options> ParseOptions(const std::vector<std::string>& args);

std::string Usage();
const char* Name(Device d);
const char* Name(Amp a);
const char* Name(Schedule s);

}  // namespace crun::train
