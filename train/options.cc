#include "train/options.h"

#include <functional>
#include <map>

#include "base/numbers.h"

namespace crun::train {
namespace {

bool ToInt(const std::string& s, long long lo, long long hi, long long* out) {
  const auto v = ParseInteger(s, lo, hi);
  if (v) *out = *v;
  return v.has_value();
}

bool ToDouble(const std::string& s, double lo, double hi, double* out) {
  const auto v = ParseNumber(s, lo, hi);
  if (v) *out = *v;
  return v.has_value();
}

}  // namespace

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
  --eval-every N          test accuracy every N epochs (and after the last), default 1
  --metrics-json FILE     write the final metrics (rank 0)
  --log-every N           steps between progress lines when stdout is not a terminal (20)
  --max-steps N           stop each epoch after N steps (benchmarks)
  -h, --help
)";
}

StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  Options o;
  using Setter = std::function<bool(const std::string&)>;
  auto int_opt = [](auto* field, long long lo, long long hi) -> Setter {
    return [=](const std::string& v) {
      long long x = 0;
      if (!ToInt(v, lo, hi, &x)) return false;
      *field = static_cast<std::remove_pointer_t<decltype(field)>>(x);
      return true;
    };
  };
  auto real_opt = [](double* field, double lo, double hi) -> Setter {
    return [=](const std::string& v) { return ToDouble(v, lo, hi, field); };
  };
  auto str_opt = [](std::string* field) -> Setter {
    return [=](const std::string& v) {
      if (v.empty()) return false;
      *field = v;
      return true;
    };
  };
  // What each option accepts, said in the error when a value is refused.
  const std::map<std::string, std::pair<Setter, std::string>> with_value = {
      {"--data-dir", {str_opt(&o.data_dir), "a directory"}},
      {"--synthetic",
       {int_opt(&o.synthetic, 10, 10'000'000), "an image count from 10 to 10000000"}},
      {"--epochs", {int_opt(&o.epochs, 1, 100000), "an integer from 1"}},
      {"--batch-size", {int_opt(&o.batch_size, 1, 65536), "an integer from 1 to 65536"}},
      {"--lr", {real_opt(&o.lr, 1e-9, 100), "a number above 0"}},
      {"--momentum", {real_opt(&o.momentum, 0, 0.9999), "a number in [0, 1)"}},
      {"--weight-decay", {real_opt(&o.weight_decay, 0, 1), "a number in [0, 1]"}},
      {"--label-smoothing", {real_opt(&o.label_smoothing, 0, 0.9999), "a number in [0, 1)"}},
      {"--warmup-epochs", {real_opt(&o.warmup_epochs, 0, 100000), "a number from 0"}},
      {"--schedule",
       {[&](const std::string& v) {
          if (v == "cosine")
            o.schedule = Schedule::kCosine;
          else if (v == "onecycle")
            o.schedule = Schedule::kOneCycle;
          else
            return false;
          return true;
        },
        "cosine or onecycle"}},
      {"--model",
       {[&](const std::string& v) {
          if (v != "resnet-small" && v != "resnet18") return false;
          o.model = v;
          return true;
        },
        "resnet-small or resnet18"}},
      {"--amp",
       {[&](const std::string& v) {
          if (v == "off")
            o.amp = Amp::kOff;
          else if (v == "bf16")
            o.amp = Amp::kBf16;
          else if (v == "fp16")
            o.amp = Amp::kFp16;
          else
            return false;
          return true;
        },
        "off, bf16 or fp16"}},
      {"--device",
       {[&](const std::string& v) {
          if (v == "cpu")
            o.device = Device::kCpu;
          else if (v == "cuda")
            o.device = Device::kCuda;
          else if (v == "auto")
            o.device = Device::kAuto;
          else
            return false;
          return true;
        },
        "cpu, cuda or auto"}},
      {"--checkpoint-dir", {str_opt(&o.checkpoint_dir), "a directory"}},
      {"--checkpoint-every", {int_opt(&o.checkpoint_every, 1, 100000), "an integer from 1"}},
      {"--eval-every", {int_opt(&o.eval_every, 1, 100000), "an integer from 1"}},
      {"--seed", {int_opt(&o.seed, 0, (1LL << 62)), "a non-negative integer"}},
      {"--threads", {int_opt(&o.threads, 1, 1024), "an integer from 1 to 1024"}},
      {"--loader-threads", {int_opt(&o.loader_threads, 1, 64), "an integer from 1 to 64"}},
      {"--metrics-json", {str_opt(&o.metrics_json), "a file name"}},
      {"--log-every", {int_opt(&o.log_every, 1, 1'000'000), "an integer from 1"}},
      {"--max-steps", {int_opt(&o.max_steps, 1, 1LL << 40), "an integer from 1"}},
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> value;
    if (const auto eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "-h" || name == "--help") {
      o.help = true;
      continue;
    }
    if (name == "--channels-last") {
      if (value) {
        return InvalidArgument("--channels-last takes no value (got '" + *value + "')");
      }
      o.channels_last = true;
      continue;
    }
    const auto it = with_value.find(name);
    if (it == with_value.end()) {
      return InvalidArgument("unknown option '" + args[i] + "' (train --help lists them)");
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return InvalidArgument(name + " needs a value: " + it->second.second);
      }
      value = args[++i];
    }
    if (!it->second.first(*value)) {
      return InvalidArgument(name + " '" + *value + "' is not valid: expected " +
                             it->second.second);
    }
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
