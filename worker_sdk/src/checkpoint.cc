#include "crun/worker/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

namespace crun::worker {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "step-";
constexpr char kSuffix[] = ".ckpt";
constexpr std::size_t kDigits = 12;

// The step of a complete checkpoint's file name, or none.
std::optional<std::uint64_t> StepOf(const std::string& name) {
  const std::size_t pre = sizeof(kPrefix) - 1, suf = sizeof(kSuffix) - 1;
  if (name.size() != pre + kDigits + suf || name.compare(0, pre, kPrefix) != 0 ||
      name.compare(pre + kDigits, suf, kSuffix) != 0) {
    return std::nullopt;
  }
  std::uint64_t step = 0;
  for (std::size_t i = pre; i < pre + kDigits; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + static_cast<std::uint64_t>(name[i] - '0');
  }
  return step;
}

Status SyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return PosixError("open " + path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return PosixError("fsync " + path, err);
  return Status::Ok();
}

}  // namespace

CheckpointDir::CheckpointDir(std::string dir, int keep)
    : dir_(std::move(dir)), keep_(std::max(keep, 1)) {}

std::string CheckpointDir::FileName(std::uint64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < kDigits) digits.insert(0, kDigits - digits.size(), '0');
  return kPrefix + digits + kSuffix;
}

Status CheckpointDir::Save(std::uint64_t step, const std::function<Status(std::ostream&)>& write) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Unavailable("checkpoint directory " + dir_ + ": " + ec.message());
  const std::string final_path = dir_ + "/" + FileName(step);
  const std::string tmp_path = dir_ + "/." + FileName(step) + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    if (!out) return PosixError("create " + tmp_path, errno);
    Status s = write(out);
    out.flush();
    if (s.ok() && !out) s = Unavailable("write " + tmp_path + ": the stream failed (disk full?)");
    if (!s.ok()) {
      out.close();
      std::remove(tmp_path.c_str());
      return s;
    }
  }
  Status synced = SyncPath(tmp_path, O_RDONLY);
  if (!synced.ok()) {
    std::remove(tmp_path.c_str());
    return synced;
  }
  if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp_path.c_str());
    return PosixError("rename " + tmp_path + " to " + final_path, err);
  }
  CRUN_RETURN_IF_ERROR(SyncPath(dir_, O_RDONLY | O_DIRECTORY));

  // Keep the newest `keep_`.
  std::vector<std::uint64_t> steps;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (auto s = StepOf(entry.path().filename().string())) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_) < steps.size(); ++i) {
    fs::remove(dir_ + "/" + FileName(steps[i]), ec);
  }
  return Status::Ok();
}

StatusOr<std::optional<Checkpoint>> CheckpointDir::Newest() const {
  std::error_code ec;
  if (!fs::exists(dir_, ec)) return std::optional<Checkpoint>();
  std::optional<Checkpoint> best;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const auto step = StepOf(entry.path().filename().string());
    if (step && (!best || *step > best->step)) best = Checkpoint{*step, entry.path().string()};
  }
  if (ec) return Unavailable("checkpoint directory " + dir_ + ": " + ec.message());
  return best;
}

}  // namespace crun::worker
