// train's torch-free parts: the command line, the CIFAR-10 binary reader on small hand-made
// files (good, truncated, wrong-sized, bad label, missing), the synthetic writer and the
// input pipeline.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "train/cifar.h"
#include "train/options.h"

using namespace crun::train;
namespace fs = std::filesystem;

namespace {

// The options, or nullopt with the error's message in `error`.
std::optional<Options> Parse(std::vector<std::string> args, std::string* error) {
  auto o = ParseOptions(args);
  if (!o.ok()) {
    CHECK(o.status().code() == crun::StatusCode::kInvalidArgument);
    *error = o.status().message();
    return std::nullopt;
  }
  return std::move(o).value();
}

fs::path TempDir(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("crun-train-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// `n` records: label i % 10, pixel bytes (i + j) % 256.
void WriteRecords(const fs::path& path, std::size_t n, std::size_t extra_bytes = 0,
                  int bad_label_at = -1) {
  std::ofstream f(path, std::ios::binary);
  for (std::size_t i = 0; i < n; ++i) {
    f.put(static_cast<char>(static_cast<int>(i) == bad_label_at ? 10 : i % 10));
    for (std::size_t j = 0; j < kPixels; ++j) f.put(static_cast<char>((i + j) % 256));
  }
  for (std::size_t j = 0; j < extra_bytes; ++j) f.put('x');
}

}  // namespace

TEST_CASE("train options: values are parsed and bad ones are named", "[train]") {
  std::string err;
  auto o = Parse({"--synthetic", "1000", "--epochs=3", "--batch-size", "64", "--lr", "0.05",
                  "--model", "resnet18", "--schedule", "onecycle", "--channels-last", "--device",
                  "cpu", "--metrics-json", "m.json"},
                 &err);
  REQUIRE(o);
  CHECK(o->synthetic == 1000);
  CHECK(o->epochs == 3);
  CHECK(o->batch_size == 64);
  CHECK(o->lr == 0.05);
  CHECK(o->model == "resnet18");
  CHECK(o->schedule == Schedule::kOneCycle);
  CHECK(o->channels_last);
  CHECK(o->device == Device::kCpu);
  CHECK(o->metrics_json == "m.json");

  CHECK_FALSE(Parse({"--synthetic", "100", "--epochs", "ten"}, &err));
  CHECK(err == "--epochs 'ten' is not valid: expected an integer from 1");
  CHECK_FALSE(Parse({"--synthetic", "100", "--batch-size", "0"}, &err));
  CHECK(err == "--batch-size '0' is not valid: expected an integer from 1 to 65536");
  CHECK_FALSE(Parse({"--synthetic", "100", "--lr", "nan"}, &err));
  CHECK(err == "--lr 'nan' is not valid: expected a number above 0");
  CHECK_FALSE(Parse({"--synthetic", "100", "--model", "vgg"}, &err));
  CHECK(err == "--model 'vgg' is not valid: expected resnet-small or resnet18");
  CHECK_FALSE(Parse({"--synthetic", "100", "--device", "tpu"}, &err));
  CHECK(err == "--device 'tpu' is not valid: expected cpu, cuda or auto");
  CHECK_FALSE(Parse({"--synthetic", "100", "--frobnicate"}, &err));
  CHECK(err == "unknown option '--frobnicate' (train --help lists them)");
  CHECK_FALSE(Parse({"--synthetic"}, &err));
  CHECK(err == "--synthetic needs a value: an image count from 10 to 10000000");
  CHECK_FALSE(Parse({"--epochs", "2"}, &err));
  CHECK(err == "no data: give --data-dir DIR (CIFAR-10 binary files) or --synthetic N");
  CHECK_FALSE(Parse({"--synthetic", "100", "--device", "cpu", "--amp", "bf16"}, &err));
  CHECK(err == "--amp bf16 needs --device cuda (autocast runs on the GPU here)");
  CHECK_FALSE(Parse({"--synthetic", "100", "--channels-last=yes"}, &err));
  CHECK(err == "--channels-last takes no value (got 'yes')");
}

TEST_CASE("train options: repeats, missing values, help and stray words", "[train]") {
  std::string err;
  auto o = Parse({"--synthetic", "100", "--epochs", "2", "--epochs=3", "-h"}, &err);
  REQUIRE(o);
  CHECK(o->epochs == 3);  // the last one counts
  CHECK(o->help);
  REQUIRE(Parse({"--help"}, &err));  // help needs no data
  CHECK_FALSE(Parse({"--data-dir", "--synthetic", "5"}, &err));
  CHECK(err == "--data-dir needs a value: a directory");
  CHECK_FALSE(Parse({"--synthetic", "100", "--epochs="}, &err));
  CHECK(err == "--epochs needs a value: an integer from 1");
  CHECK_FALSE(Parse({"--synthetic", "100", "--seed", "-1"}, &err));
  CHECK(err == "--seed '-1' is not valid: expected a non-negative integer");
  CHECK_FALSE(Parse({"--synthetic", "100", "stray"}, &err));
  CHECK(err == "unknown option 'stray' (train --help lists them)");
  CHECK_FALSE(Parse({"--synthetic", "100", "--", "--epochs", "3"}, &err));
  CHECK(err == "unknown option '--' (train --help lists them)");
  CHECK_FALSE(Parse({"--synthetic", "100", "--channels-last", "yes"}, &err));
  CHECK(err == "--channels-last takes no value (got 'yes')");
}

TEST_CASE("cifar reader: records, truncated and wrong-sized files, bad labels, missing files",
          "[train]") {
  const fs::path dir = TempDir("reader");
  for (int k = 1; k <= 5; ++k) WriteRecords(dir / ("data_batch_" + std::to_string(k) + ".bin"), 3);
  WriteRecords(dir / "test_batch.bin", 4);

  auto train = LoadCifar(dir.string(), true);
  REQUIRE(train.ok());
  CHECK(train->size() == 15);
  CHECK(train->labels[4] == 1);  // second file's second record: i = 1
  CHECK(train->pixels[1 * kPixels + 5] == 6);
  auto test = LoadCifar(dir.string(), false);
  REQUIRE(test.ok());
  CHECK(test->size() == 4);

  // Truncated in the middle of a record.
  WriteRecords(dir / "data_batch_3.bin", 2, 100);
  auto bad = LoadCifar(dir.string(), true);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(),
             Catch::Contains(
                 "data_batch_3.bin has 6246 bytes, not a whole number of 3073-byte records"));

  // Empty.
  WriteRecords(dir / "data_batch_3.bin", 0);
  bad = LoadCifar(dir.string(), true);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("data_batch_3.bin has 0 bytes"));

  // A label outside 0-9.
  WriteRecords(dir / "data_batch_3.bin", 3, 0, 2);
  bad = LoadCifar(dir.string(), true);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(),
             Catch::Contains("data_batch_3.bin, record 2: label 10 is not 0-9"));

  // Missing.
  fs::remove(dir / "test_batch.bin");
  bad = LoadCifar(dir.string(), false);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains((dir / "test_batch.bin").string()));
  fs::remove_all(dir);
}

TEST_CASE("synthetic cifar: the binary format, balanced classes, deterministic, not rewritten",
          "[train]") {
  const fs::path a = TempDir("synth-a"), b = TempDir("synth-b");
  REQUIRE(WriteSyntheticCifar(a.string(), 503, 50, 7).ok());
  REQUIRE(WriteSyntheticCifar(b.string(), 503, 50, 7).ok());
  auto da = LoadCifar(a.string(), true);
  auto db = LoadCifar(b.string(), true);
  REQUIRE(da.ok());
  REQUIRE(db.ok());
  CHECK(da->size() == 503);
  CHECK(da->pixels == db->pixels);
  CHECK(da->labels == db->labels);
  std::vector<int> per_class(kClasses);
  for (auto l : da->labels) ++per_class[l];
  CHECK(*std::min_element(per_class.begin(), per_class.end()) >= 50);
  auto test = LoadCifar(a.string(), false);
  REQUIRE(test.ok());
  CHECK(test->size() == 50);

  // The same request again leaves the files alone; another seed rewrites them.
  const auto before = fs::last_write_time(a / "data_batch_1.bin");
  REQUIRE(WriteSyntheticCifar(a.string(), 503, 50, 7).ok());
  CHECK(fs::last_write_time(a / "data_batch_1.bin") == before);
  REQUIRE(WriteSyntheticCifar(a.string(), 503, 50, 8).ok());
  auto dc = LoadCifar(a.string(), true);
  REQUIRE(dc.ok());
  CHECK(dc->pixels != db->pixels);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_CASE("input pipeline: normalised crops and flips, every index once, in order", "[train]") {
  Dataset d;
  d.labels = {3, 7};
  d.pixels.assign(2 * kPixels, 0);
  for (std::size_t j = 0; j < kPixels; ++j) d.pixels[kPixels + j] = 255;  // image 1 all white
  const std::size_t idx[] = {1, 0};
  Batch plain = MakeBatch(d, idx, 2, false, 0);
  REQUIRE(plain.size() == 2);
  CHECK(plain.labels == std::vector<std::int64_t>{7, 3});
  CHECK(plain.images[0] == Approx((1.f - kMean[0]) / kStd[0]));
  CHECK(plain.images[kPixels] == Approx(-kMean[0] / kStd[0]));
  // Augmented: a shifted crop brings in black padding somewhere for some seed.
  bool padded = false;
  for (std::uint64_t seed = 0; seed < 20 && !padded; ++seed) {
    Batch aug = MakeBatch(d, idx, 1, true, seed);
    for (float v : aug.images) padded |= v == Approx(-kMean[0] / kStd[0]) || v < 0;
  }
  CHECK(padded);

  std::vector<std::size_t> order(10);
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i % 2;
  Prefetcher p(d, order, 4, false, false, 1, 2);
  CHECK(p.batches() == 3);
  std::vector<std::int64_t> labels;
  Batch b;
  while (p.Next(&b)) labels.insert(labels.end(), b.labels.begin(), b.labels.end());
  CHECK(labels == std::vector<std::int64_t>{3, 7, 3, 7, 3, 7, 3, 7, 3, 7});
  Prefetcher dropped(d, order, 4, true, false, 1, 2);
  CHECK(dropped.batches() == 2);
}

TEST_CASE("input pipeline: several builder threads give the same batches in the same order",
          "[train]") {
  const fs::path dir = TempDir("threads");
  REQUIRE(WriteSyntheticCifar(dir.string(), 300, 10, 3).ok());
  auto d = LoadCifar(dir.string(), true);
  REQUIRE(d.ok());
  std::vector<std::size_t> order(d->size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = (i * 7) % order.size();
  auto all = [&](int threads) {
    Prefetcher p(*d, order, 32, false, true, 11, 3, threads);
    std::vector<float> images;
    std::vector<std::int64_t> labels;
    Batch b;
    while (p.Next(&b)) {
      images.insert(images.end(), b.images.begin(), b.images.end());
      labels.insert(labels.end(), b.labels.begin(), b.labels.end());
    }
    return std::make_pair(images, labels);
  };
  const auto one = all(1);
  CHECK(one.second.size() == 300);
  CHECK(all(4) == one);
  // Abandoned half-way: the destructor stops the builders.
  {
    Prefetcher p(*d, order, 32, false, true, 11, 3, 4);
    Batch b;
    p.Next(&b);
  }
  fs::remove_all(dir);
}
