// CIFAR-10 for train: the official binary version on disk, a learnable synthetic dataset
// written in that same format, and the input pipeline (shuffled shards, random crop and flip,
// normalisation) running ahead of training on a thread of its own. No libtorch here: batches
// are plain float arrays that the training loop wraps as tensors.
//
// Format (www.cs.toronto.edu/~kriz/cifar.html, "binary version"): each record is 1 label byte
// (0-9) then 3072 pixel bytes, the 1024 red values of the 32x32 image row by row, then green,
// then blue. data_batch_1.bin ... data_batch_5.bin hold the training set, test_batch.bin the
// test set.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace crun::train {

constexpr int kClasses = 10;
constexpr int kSide = 32;
constexpr std::size_t kPixels = 3 * kSide * kSide;  // 3072
constexpr std::size_t kRecord = 1 + kPixels;        // 3073

struct Dataset {
  std::vector<std::uint8_t> labels;
  std::vector<std::uint8_t> pixels;  // size() * kPixels, CHW per image
  std::size_t size() const { return labels.size(); }
};

// The training files (data_batch_1..5.bin) or the test file (test_batch.bin) of `dir`. A
// missing file, one whose size is not a whole number of records, or a label above 9 is an
// error naming the file (and the record).
StatusOr<Dataset> LoadCifar(const std::string& dir, bool train);

// Reads one file of records.
Status AppendCifarFile(const std::string& path, Dataset* into);

// Writes `train_images` training images (split over the five batch files) and `test_images`
// test images to `dir`: per class a fixed pattern (colour, stripes of a class-specific
// orientation and frequency, a blob) with random shifts and noise, so a small network learns
// it well above chance in an epoch or two. Deterministic in `seed`; files appear atomically.
Status WriteSyntheticCifar(const std::string& dir, std::size_t train_images,
                           std::size_t test_images, std::uint64_t seed);

// Per-channel mean and standard deviation of CIFAR-10's training set (on a 0-1 scale).
extern const float kMean[3];
extern const float kStd[3];

struct Batch {
  std::vector<float> images;         // n * 3 * 32 * 32, normalised, CHW
  std::vector<std::int64_t> labels;  // n
  std::size_t size() const { return labels.size(); }
};

// Builds the batch of `indices` (augmented: random crop of the 4-padded image and a random
// horizontal flip, from `rng_seed`).
Batch MakeBatch(const Dataset& data, const std::size_t* indices, std::size_t n, bool augment,
                std::uint64_t rng_seed);

// Produces the batches of one epoch, handed out in order, built by `threads` threads of its
// own up to `depth` batches ahead of the consumer. The last batch may be short unless
// `drop_last`. Batch k's augmentation is seeded by seed and k alone, so the batches do not
// depend on the number of threads. `low_priority` lowers the builders' scheduling priority
// (nice 10), for CPU training, where every core runs the model and a builder preempting one of
// its threads stalls them all.
class Prefetcher {
 public:
  // `first`: the batch to begin at (a resumed epoch skips those it trained).
  Prefetcher(const Dataset& data, std::vector<std::size_t> indices, std::size_t batch_size,
             bool drop_last, bool augment, std::uint64_t seed, std::size_t depth = 4,
             int threads = 1, bool low_priority = false, std::size_t first = 0);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  std::size_t batches() const { return batches_; }
  // The next batch; false after the last one.
  bool Next(Batch* out);

 private:
  void Run(bool low_priority);

  const Dataset& data_;
  const std::vector<std::size_t> indices_;
  const std::size_t batch_size_;
  const std::size_t batches_;
  const bool augment_;
  const std::uint64_t seed_;
  const std::size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::size_t, Batch> ready_;  // built, not yet taken, by batch number
  std::size_t claimed_ = 0;             // batches handed to a builder so far
  std::size_t taken_ = 0;               // batches handed to the consumer so far
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace crun::train
