// The SDK's torch-free training helpers: the distributed sampler and atomic checkpoint files.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "crun/worker/checkpoint.h"
#include "crun/worker/sampler.h"

using crun::worker::CheckpointDir;
using crun::worker::DistributedSampler;
using crun::worker::SamplerOptions;

namespace {

std::vector<std::vector<std::size_t>> Shards(std::size_t n, int world, SamplerOptions o,
                                             std::uint64_t epoch) {
  std::vector<std::vector<std::size_t>> out;
  for (int r = 0; r < world; ++r) {
    auto made = DistributedSampler::Create(n, r, world, o);
    REQUIRE(made.ok());
    DistributedSampler& s = *made;
    s.set_epoch(epoch);
    out.push_back(s.indices());
    REQUIRE(out.back().size() == s.size());
  }
  return out;
}

std::string TempDir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("crun-ckpt-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

crun::Status WriteText(std::ostream& out, const std::string& text) {
  out << text;
  return crun::Status::Ok();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("sampler: equal disjoint shards that cover the dataset, padded or dropped", "[sampler]") {
  for (int world : {1, 2, 3, 5}) {
    for (std::size_t n : {std::size_t{10}, std::size_t{13}, std::size_t{103}}) {
      INFO("world " << world << ", " << n << " samples");
      // Padded: every sample appears, shards are equal, at most world-1 repeats.
      auto padded = Shards(n, world, {}, 0);
      std::multiset<std::size_t> all;
      for (const auto& s : padded) {
        CHECK(s.size() == (n + world - 1) / world);
        all.insert(s.begin(), s.end());
      }
      CHECK(std::set<std::size_t>(all.begin(), all.end()).size() == n);
      CHECK(all.size() - n < static_cast<std::size_t>(world));
      // Dropped: disjoint, floor(n / world) each.
      SamplerOptions drop;
      drop.drop_last = true;
      std::set<std::size_t> seen;
      for (const auto& s : Shards(n, world, drop, 0)) {
        CHECK(s.size() == n / world);
        for (auto i : s) CHECK(seen.insert(i).second);
      }
    }
  }
}

TEST_CASE("sampler: the same permutation on every rank per epoch, a new one each epoch",
          "[sampler]") {
  SamplerOptions o;
  o.seed = 42;
  auto e0 = Shards(1000, 4, o, 0);
  CHECK(e0 == Shards(1000, 4, o, 0));  // independent constructions agree
  auto e1 = Shards(1000, 4, o, 1);
  CHECK(e0 != e1);
  o.seed = 43;
  CHECK(Shards(1000, 4, o, 0) != e0);
  SamplerOptions ordered;
  ordered.shuffle = false;
  CHECK(Shards(7, 2, ordered, 3)[1] == std::vector<std::size_t>{1, 3, 5, 0});  // padded with 0
  auto bad = DistributedSampler::Create(10, 2, 2);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == crun::StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("rank 2 is not in a world of 2"));
}

TEST_CASE("checkpoints: the newest complete one wins, older ones are pruned", "[checkpoint]") {
  const std::string dir = TempDir("prune");
  CheckpointDir ckpt(dir, 2);
  auto none = ckpt.Newest();
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
  for (std::uint64_t step : {10, 20, 30}) {
    REQUIRE(
        ckpt.Save(step, [&](std::ostream& o) { return WriteText(o, std::to_string(step)); }).ok());
  }
  auto newest = ckpt.Newest();
  REQUIRE(newest.ok());
  REQUIRE(newest->has_value());
  CHECK((*newest)->step == 30);
  CHECK(ReadAll((*newest)->path) == "30");
  CHECK_FALSE(std::filesystem::exists(dir + "/" + CheckpointDir::FileName(10)));
  CHECK(std::filesystem::exists(dir + "/" + CheckpointDir::FileName(20)));
  std::filesystem::remove_all(dir);
}

TEST_CASE("checkpoints: an interrupted or failed save leaves the last good one", "[checkpoint]") {
  const std::string dir = TempDir("interrupted");
  CheckpointDir ckpt(dir);
  REQUIRE(ckpt.Save(5, [](std::ostream& o) { return WriteText(o, "good"); }).ok());
  // What a save killed halfway leaves behind: a temporary file with a higher step.
  std::ofstream(dir + "/." + CheckpointDir::FileName(6) + ".tmp.999") << "half";
  // A writer that fails: its error comes back, and no file of step 7 appears.
  auto failed = ckpt.Save(7, [](std::ostream& o) {
    o << "partial";
    return crun::InternalError("serialising the optimizer failed");
  });
  CHECK(failed.message() == "serialising the optimizer failed");
  auto newest = ckpt.Newest();
  REQUIRE(newest.ok());
  REQUIRE(newest->has_value());
  CHECK((*newest)->step == 5);
  CHECK(ReadAll((*newest)->path) == "good");
  CHECK_FALSE(std::filesystem::exists(dir + "/" + CheckpointDir::FileName(7)));
  std::filesystem::remove_all(dir);
}

TEST_CASE("checkpoints: an unusable directory is named in the error", "[checkpoint]") {
  CheckpointDir ckpt("/proc/crun-no-such-dir/ckpt");
  auto s = ckpt.Save(1, [](std::ostream& o) { return WriteText(o, "x"); });
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains("/proc/crun-no-such-dir/ckpt"));
}
