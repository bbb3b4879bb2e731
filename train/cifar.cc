#include "train/cifar.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace crun::train {

const float kMean[3] = {0.4914f, 0.4822f, 0.4465f};
const float kStd[3] = {0.2470f, 0.2435f, 0.2616f};

namespace {

std::string TrainFile(int k) { return "data_batch_" + std::to_string(k) + ".bin"; }
constexpr const char* kTestFile = "test_batch.bin";

// A 64-bit mix (splitmix64): independent streams from one seed.
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One synthetic image of class `c` into `rec` (label byte first).
void SyntheticImage(int c, std::mt19937_64& rng, std::uint8_t* rec) {
  static constexpr float kColour[5][3] = {{0.85f, 0.25f, 0.20f},
                                          {0.20f, 0.70f, 0.30f},
                                          {0.25f, 0.35f, 0.85f},
                                          {0.80f, 0.75f, 0.20f},
                                          {0.60f, 0.30f, 0.75f}};
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::normal_distribution<float> noise(0.f, 0.12f);
  const float* colour = kColour[c % 5];
  // Classes sharing a colour differ in stripe orientation and frequency.
  const float angle = static_cast<float>(c) * 0.314159f + (u(rng) - 0.5f) * 0.2f;
  const float freq = 0.35f + 0.12f * static_cast<float>(c / 5) + 0.04f * static_cast<float>(c % 3);
  const float phase = u(rng) * 6.2832f;
  const float bx = 8.f + u(rng) * 16.f, by = 8.f + u(rng) * 16.f;
  const float brightness = 0.8f + 0.4f * u(rng);
  rec[0] = static_cast<std::uint8_t>(c);
  const float ca = std::cos(angle), sa = std::sin(angle);
  for (int y = 0; y < kSide; ++y) {
    for (int x = 0; x < kSide; ++x) {
      const float stripe =
          0.5f +
          0.5f * std::sin(freq * (ca * static_cast<float>(x) + sa * static_cast<float>(y)) + phase);
      const float d2 = (static_cast<float>(x) - bx) * (static_cast<float>(x) - bx) +
                       (static_cast<float>(y) - by) * (static_cast<float>(y) - by);
      const float blob = std::exp(-d2 / 40.f);
      for (int ch = 0; ch < 3; ++ch) {
        float v = brightness * (0.35f * colour[ch] + 0.4f * stripe * colour[ch] +
                                0.25f * blob * (1.f - colour[ch])) +
                  noise(rng);
        v = std::clamp(v, 0.f, 1.f);
        rec[1 + static_cast<std::size_t>(ch) * kSide * kSide + static_cast<std::size_t>(y) * kSide +
            static_cast<std::size_t>(x)] = static_cast<std::uint8_t>(std::lround(v * 255.f));
      }
    }
  }
}

// Puts `size` bytes at `path` atomically: a temporary file beside it, then a rename, so a
// reader (another local rank) never sees a half-written file.
Status WriteAtomically(const std::string& path, const void* data, std::size_t size) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    f.flush();
    if (!f) {
      std::filesystem::remove(tmp);
      return PosixError("cannot write " + tmp, errno, StatusCode::kUnavailable);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Unavailable("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return Status::Ok();
}

// Writes `count` images starting at image number `first` to `path`.
Status WriteFile(const std::string& path, std::size_t first, std::size_t count,
                 std::uint64_t seed) {
  std::vector<std::uint8_t> bytes(count * kRecord);
  for (std::size_t i = 0; i < count; ++i) {
    std::mt19937_64 rng(Mix(seed ^ Mix(first + i)));
    const int c = static_cast<int>((first + i) % kClasses);
    SyntheticImage(c, rng, bytes.data() + i * kRecord);
  }
  return WriteAtomically(path, bytes.data(), bytes.size());
}

}  // namespace

Status AppendCifarFile(const std::string& path, Dataset* into) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return InvalidArgument("CIFAR-10 file " + path + ": " + ec.message());
  if (size == 0 || size % kRecord != 0) {
    return InvalidArgument("CIFAR-10 file " + path + " has " + std::to_string(size) +
                           " bytes, not a whole number of " + std::to_string(kRecord) +
                           "-byte records (truncated or not the binary version?)");
  }
  std::ifstream f(path, std::ios::binary);
  std::vector<std::uint8_t> bytes(size);
  f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (!f) return InvalidArgument("CIFAR-10 file " + path + ": read failed");
  const std::size_t n = size / kRecord;
  const std::size_t base = into->labels.size();
  into->labels.resize(base + n);
  into->pixels.resize((base + n) * kPixels);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t* rec = bytes.data() + i * kRecord;
    if (rec[0] >= kClasses) {
      return InvalidArgument("CIFAR-10 file " + path + ", record " + std::to_string(i) +
                             ": label " + std::to_string(rec[0]) + " is not 0-9");
    }
    into->labels[base + i] = rec[0];
    std::memcpy(into->pixels.data() + (base + i) * kPixels, rec + 1, kPixels);
  }
  return Status::Ok();
}

StatusOr<Dataset> LoadCifar(const std::string& dir, bool train) {
  Dataset d;
  if (train) {
    for (int k = 1; k <= 5; ++k)
      CRUN_RETURN_IF_ERROR(AppendCifarFile(dir + "/" + TrainFile(k), &d));
  } else {
    CRUN_RETURN_IF_ERROR(AppendCifarFile(dir + "/" + kTestFile, &d));
  }
  return d;
}

Status WriteSyntheticCifar(const std::string& dir, std::size_t train_images,
                           std::size_t test_images, std::uint64_t seed) {
  if (train_images < 5 || test_images < 1) {
    return InvalidArgument("synthetic CIFAR-10 needs at least 5 training and 1 test image");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Unavailable("cannot create " + dir + ": " + ec.message());
  // A stamp says which dataset the files hold: the same one again is not regenerated.
  const std::string stamp_path = dir + "/crun-synthetic.txt";
  const std::string stamp = "train=" + std::to_string(train_images) +
                            " test=" + std::to_string(test_images) +
                            " seed=" + std::to_string(seed) + "\n";
  {
    std::ifstream in(stamp_path);
    std::stringstream have;
    have << in.rdbuf();
    if (in && have.str() == stamp) return Status::Ok();
  }
  std::filesystem::remove(stamp_path, ec);
  std::size_t first = 0;
  for (int k = 1; k <= 5; ++k) {
    const std::size_t count =
        train_images / 5 + (static_cast<std::size_t>(k) <= train_images % 5 ? 1 : 0);
    CRUN_RETURN_IF_ERROR(WriteFile(dir + "/" + TrainFile(k), first, count, seed));
    first += count;
  }
  // Test images come from a stream of their own: never copies of training images.
  CRUN_RETURN_IF_ERROR(WriteFile(dir + "/" + kTestFile, 0, test_images, Mix(seed + 0x7e57)));
  return WriteAtomically(stamp_path, stamp.data(), stamp.size());
}

Batch MakeBatch(const Dataset& data, const std::size_t* indices, std::size_t n, bool augment,
                std::uint64_t rng_seed) {
  Batch b;
  b.images.resize(n * kPixels);
  b.labels.resize(n);
  std::mt19937_64 rng(rng_seed);
  float scale[3], shift[3];
  for (int ch = 0; ch < 3; ++ch) {
    scale[ch] = 1.f / (255.f * kStd[ch]);
    shift[ch] = -kMean[ch] / kStd[ch];
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t idx = indices[i];
    b.labels[i] = data.labels[idx];
    const std::uint8_t* src = data.pixels.data() + idx * kPixels;
    float* dst = b.images.data() + i * kPixels;
    int dx = 0, dy = 0;
    bool flip = false;
    if (augment) {
      const std::uint64_t r = rng();
      dx = static_cast<int>(r % 9) - 4;  // crop offset within the 4-pixel padding
      dy = static_cast<int>((r >> 8) % 9) - 4;
      flip = ((r >> 16) & 1) != 0;
    }
    for (int ch = 0; ch < 3; ++ch) {
      const std::uint8_t* plane = src + static_cast<std::size_t>(ch) * kSide * kSide;
      float* out = dst + static_cast<std::size_t>(ch) * kSide * kSide;
      for (int y = 0; y < kSide; ++y) {
        const int sy = y + dy;
        for (int x = 0; x < kSide; ++x) {
          const int sx = (flip ? kSide - 1 - x : x) + dx;
          // Outside the image is the zero padding (black before normalisation).
          const float v = (sy < 0 || sy >= kSide || sx < 0 || sx >= kSide)
                              ? 0.f
                              : static_cast<float>(plane[sy * kSide + sx]);
          out[y * kSide + x] = v * scale[ch] + shift[ch];
        }
      }
    }
  }
  return b;
}

Prefetcher::Prefetcher(const Dataset& data, std::vector<std::size_t> indices,
                       std::size_t batch_size, bool drop_last, bool augment, std::uint64_t seed,
                       std::size_t depth, int threads, bool low_priority, std::size_t first)
    : data_(data),
      indices_(std::move(indices)),
      batch_size_(batch_size),
      batches_(drop_last ? indices_.size() / batch_size
                         : (indices_.size() + batch_size - 1) / batch_size),
      augment_(augment),
      seed_(seed),
      depth_(std::max<std::size_t>(depth, 1)) {
  claimed_ = taken_ = std::min(first, batches_);
  for (int t = 0; t < std::max(threads, 1); ++t) {
    threads_.emplace_back([this, low_priority] { Run(low_priority); });
  }
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Prefetcher::Run(bool low_priority) {
  // Linux applies nice per thread; failing to lower it only costs speed.
  if (low_priority) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  for (;;) {
    std::size_t k = 0;
    {
      std::unique_lock<std::mutex> l(mu_);
      // Claim the next batch once it is within `depth` of the consumer.
      cv_.wait(l, [&] { return stop_ || claimed_ == batches_ || claimed_ < taken_ + depth_; });
      if (stop_ || claimed_ == batches_) return;
      k = claimed_++;
    }
    const std::size_t begin = k * batch_size_;
    const std::size_t n = std::min(batch_size_, indices_.size() - begin);
    Batch b = MakeBatch(data_, indices_.data() + begin, n, augment_, Mix(seed_ + k));
    {
      std::lock_guard<std::mutex> l(mu_);
      ready_.emplace(k, std::move(b));
    }
    cv_.notify_all();
  }
}

bool Prefetcher::Next(Batch* out) {
  std::unique_lock<std::mutex> l(mu_);
  if (taken_ == batches_) return false;
  cv_.wait(l, [&] { return ready_.count(taken_) > 0; });
  auto it = ready_.find(taken_);
  *out = std::move(it->second);
  ready_.erase(it);
  ++taken_;
  l.unlock();
  cv_.notify_all();
  return true;
}

}  // namespace crun::train
