#include "train/options.h"

#include <algorithm>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/numbers.h"

namespace crun::train {
const char* Name(Device d) {
  switch (d) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
    case Device::kAuto:
      return "auto";
  }
  return "?";
}
const char* Name(Amp a) {
  switch (a) {
    case Amp::kOff:
      return "off";
    case Amp::kBf16:
      return "bf16";
    case Amp::kFp16:
      return "fp16";
  }
  return "?";
}
const char* Name(Schedule s) { return s == Schedule::kCosine ? "cosine" : "onecycle"; }

std::string Usage() {
  return R"(usage: train [options]   (under crun: crun --nproc-per-node N train [options])

CIFAR-10 training on libtorch with crun's worker SDK (Gloo on CPU, NCCL on GPU).

data
  --data-dir DIR          CIFAR-10 binary version: data_batch_1.bin ... data_batch_5.bin and
                          test_batch.bin (no download: give the files or use --synthetic)
  --synthetic N           generate a learnable dataset of N training images (N/5 test) in the
                          same binary format (into --data-dir, else a temporary directory)
model and training
  --model NAME            resnet-small (CPU-sized, default) | resnet18 (CIFAR ResNet-18)
  --epochs N              default 10
  --batch-size N          per worker, default 128
  --lr X                  peak learning rate, default 0.1
  --momentum X            SGD momentum (Nesterov), default 0.9
  --weight-decay X        default 5e-4
  --label-smoothing X     default 0.1
  --warmup-epochs X       linear warm-up, default 1
  --schedule NAME         cosine (default) | onecycle
  --amp MODE              off (default) | bf16 | fp16 (autocast; CUDA only)
  --channels-last         NHWC memory format (CUDA)
  --device NAME           cpu | cuda | auto (default: cuda when a GPU is visible)
  --threads N             intra-op threads; default cores / LOCAL_WORLD_SIZE
  --loader-threads N      threads building batches; default 1 on CPU, up to 8 on a GPU
  --seed N                default 0
checkpoints, evaluation, output
  --checkpoint-dir DIR    save every --checkpoint-every epochs (rank 0, atomic) and resume
                          from the newest on start, also at a different world size
  --checkpoint-every N    default 1
  --snapshot-every N      save a snapshot into crun's node memory every N steps and resume
                          from it after a restart (docs/checkpoints.md); default 1 on CPU,
                          50 on a GPU; 0: none
  --eval-every N          test accuracy every N epochs (and after the last), default 1
  --metrics-json FILE     write the final metrics (rank 0)
  --log-every N           steps between progress lines when stdout is not a terminal (20)
  --max-steps N           stop each epoch after N steps (benchmarks)
  -h, --help
)";
}

namespace {

// Takes one option's value; false when it is not one the option accepts.
using Setter = std::function<bool(const std::string&)>;

Setter Integer(auto* field, long long lo, long long hi) {
  return [=](const std::string& v) {
    const auto x = ParseInteger(v, lo, hi);
    if (x) *field = static_cast<std::remove_pointer_t<decltype(field)>>(*x);
    return x.has_value();
  };
}

Setter Real(double* field, double lo, double hi) {
  return [=](const std::string& v) {
    const auto x = ParseNumber(v, lo, hi);
    if (x) *field = *x;
    return x.has_value();
  };
}

Setter Text(std::string* field) {
  return [=](const std::string& v) {
    *field = v;
    return true;
  };
}

// One of `choices`, by name.
template <typename T>
Setter OneOf(T* field, std::vector<std::pair<std::string, T>> choices) {
  return [=](const std::string& v) {
    for (const auto& [name, value] : choices) {
      if (v != name) continue;
      *field = value;
      return true;
    }
    return false;
  };
}

// An option that takes a value. `accepts` says what, in the error when the value is missing or
// refused ("--epochs 'ten' is not valid: expected an integer from 1"). The last one given
// counts. CLI11 calls `set` once parsing is done; a refusal ends the parse.
void AddValued(CLI::App& app, const std::string& name, const std::string& accepts, Setter set) {
  app.add_option_function<std::string>(name,
                                       [name, accepts, set](const std::string& v) {
                                         if (v.empty())
                                           throw CLI::ValidationError(name +
                                                                      " needs a value: " + accepts);
                                         if (!set(v)) {
                                           throw CLI::ValidationError(name + " '" + v +
                                                                      "' is not valid: expected " +
                                                                      accepts);
                                         }
                                       })
      ->expected(0, 1)  // a missing value reaches `set` as "", for the message above
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

}  // namespace

StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  Options o;
  CLI::App app{"train", "train"};
  app.set_help_flag();  // Usage() is the help; main prints it
  app.add_flag("-h,--help", o.help);
  app.allow_extras();  // named below, as train names them
  app.add_option_function<std::string>("--channels-last",
                                       [&](const std::string& v) {
                                         if (!v.empty()) {
                                           throw CLI::ValidationError(
                                               "--channels-last takes no value (got '" + v + "')");
                                         }
                                         o.channels_last = true;
                                       })
      ->expected(0, 1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  AddValued(app, "--data-dir", "a directory", Text(&o.data_dir));
  AddValued(app, "--synthetic", "an image count from 10 to 10000000",
            Integer(&o.synthetic, 10, 10'000'000));
  AddValued(app, "--epochs", "an integer from 1", Integer(&o.epochs, 1, 100000));
  AddValued(app, "--batch-size", "an integer from 1 to 65536", Integer(&o.batch_size, 1, 65536));
  AddValued(app, "--lr", "a number above 0", Real(&o.lr, 1e-9, 100));
  AddValued(app, "--momentum", "a number in [0, 1)", Real(&o.momentum, 0, 0.9999));
  AddValued(app, "--weight-decay", "a number in [0, 1]", Real(&o.weight_decay, 0, 1));
  AddValued(app, "--label-smoothing", "a number in [0, 1)", Real(&o.label_smoothing, 0, 0.9999));
  AddValued(app, "--warmup-epochs", "a number from 0", Real(&o.warmup_epochs, 0, 100000));
  AddValued(app, "--schedule", "cosine or onecycle",
            OneOf(&o.schedule, {{"cosine", Schedule::kCosine}, {"onecycle", Schedule::kOneCycle}}));
  AddValued(app, "--model", "resnet-small or resnet18",
            OneOf(&o.model, {{"resnet-small", "resnet-small"}, {"resnet18", "resnet18"}}));
  AddValued(app, "--amp", "off, bf16 or fp16",
            OneOf(&o.amp, {{"off", Amp::kOff}, {"bf16", Amp::kBf16}, {"fp16", Amp::kFp16}}));
  AddValued(app, "--device", "cpu, cuda or auto",
            OneOf(&o.device,
                  {{"cpu", Device::kCpu}, {"cuda", Device::kCuda}, {"auto", Device::kAuto}}));
  AddValued(app, "--checkpoint-dir", "a directory", Text(&o.checkpoint_dir));
  AddValued(app, "--checkpoint-every", "an integer from 1",
            Integer(&o.checkpoint_every, 1, 100000));
  AddValued(app, "--snapshot-every", "an integer from 0", Integer(&o.snapshot_every, 0, 100000000));
  AddValued(app, "--eval-every", "an integer from 1", Integer(&o.eval_every, 1, 100000));
  AddValued(app, "--seed", "a non-negative integer", Integer(&o.seed, 0, 1LL << 62));
  AddValued(app, "--threads", "an integer from 1 to 1024", Integer(&o.threads, 1, 1024));
  AddValued(app, "--loader-threads", "an integer from 1 to 64", Integer(&o.loader_threads, 1, 64));
  AddValued(app, "--metrics-json", "a file name", Text(&o.metrics_json));
  AddValued(app, "--log-every", "an integer from 1", Integer(&o.log_every, 1, 1'000'000));
  AddValued(app, "--max-steps", "an integer from 1", Integer(&o.max_steps, 1, 1LL << 40));

  // train takes no arguments but options, so "--" ends nothing: CLI11 would skip it.
  if (std::find(args.begin(), args.end(), "--") != args.end()) {
    return InvalidArgument("unknown option '--' (train --help lists them)");
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11's order
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(e.what());
  }
  if (const auto extra = app.remaining(); !extra.empty()) {
    return InvalidArgument("unknown option '" + extra.front() + "' (train --help lists them)");
  }
  if (o.data_dir.empty() && o.synthetic == 0 && !o.help) {
    return InvalidArgument("no data: give --data-dir DIR (CIFAR-10 binary files) or --synthetic N");
  }
  if (o.amp != Amp::kOff && o.device == Device::kCpu) {
    return InvalidArgument("--amp " + std::string(Name(o.amp)) +
                           " needs --device cuda (autocast runs on the GPU here)");
  }
  return o;
}

}  // namespace crun::train
