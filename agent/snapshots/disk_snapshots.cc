#include "agent/snapshots/disk_snapshots.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include <crun/worker/snapshot_layout.h>

#include "base/numbers.h"
#include "base/socket.h"
#include "rendezvous/store/tcp_store_client.h"

namespace crun::agent {
namespace {

namespace snap = crun::snapshot;
namespace fs = std::filesystem;

Status WriteWhole(int fd, const unsigned char* data, std::size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return PosixError("writing " + path, errno);
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return Status::Ok();
}

Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return PosixError("opening " + dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? Status::Ok() : PosixError("flushing " + dir, err);
}

// The step of a "step-<digits>" directory name.
std::optional<std::uint64_t> StepOfDir(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  const auto v = ParseInteger(std::string_view(name).substr(5), 0, INT64_MAX);
  if (!v) return std::nullopt;
  return static_cast<std::uint64_t>(*v);
}

// Every step directory under `dir` holding a file of `rank`, newest first.
std::vector<std::uint64_t> StepsWithRank(const std::string& dir, std::int64_t rank) {
  std::vector<std::uint64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto step = StepOfDir(e.path().filename().string());
    if (step && ::access(SnapshotFilePath(dir, *step, rank).c_str(), R_OK) == 0) {
      steps.push_back(*step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

bool ReadHeader(const std::string& path, snap::BufferHeader* h) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = ::pread(fd, h, sizeof *h, 0);
  ::close(fd);
  return n == static_cast<ssize_t>(sizeof *h) && snap::HasMagic(*h);
}

// Whether the pid written in a file's name is a process of this host no longer.
bool PidGone(std::string_view text) {
  const auto pid = ParseInteger(text, 1, INT32_MAX);
  return pid && ::kill(static_cast<pid_t>(*pid), 0) != 0 && errno == ESRCH;
}

// Removes what a crun killed in the middle of a write left: "<file>.tmp-<pid>" whose pid is
// gone.
void RemoveStaleTemporaries(const std::string& dir) {
  std::error_code ec;
  for (const auto& step : fs::directory_iterator(dir, ec)) {
    if (!StepOfDir(step.path().filename().string())) continue;
    std::error_code inner;
    for (const auto& f : fs::directory_iterator(step.path(), inner)) {
      const std::string name = f.path().filename().string();
      const auto at = name.rfind(".tmp-");
      if (at == std::string::npos) continue;
      if (PidGone(std::string_view(name).substr(at + 5))) ::unlink(f.path().c_str());
    }
    ::rmdir(step.path().c_str());  // only when nothing else is left in it
  }
}

constexpr std::string_view kClaimPrefix = ".crun-claim-";
constexpr std::string_view kDiskKey = "crun/disk/";
constexpr std::string_view kClaimDraft = ".crun-claim-draft-";

std::string ReadSmallFile(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

// A draft ("<draft prefix><host>-<pid>-<n>") is a claim still being written: its crun may not
// hold the lock yet, so a lock probe proves nothing (and would take the lock from under it).
// It is removed only when its crun ran on this host and is gone.
void RemoveDeadDraft(const fs::path& path, std::string_view host) {
  const std::string name = path.filename().string();
  const std::string_view rest = std::string_view(name).substr(kClaimDraft.size());
  const auto n_at = rest.rfind('-');
  if (n_at == std::string_view::npos || n_at == 0) return;
  const auto pid_at = rest.rfind('-', n_at - 1);
  if (pid_at == std::string_view::npos || rest.substr(0, pid_at) != host) return;
  if (PidGone(rest.substr(pid_at + 1, n_at - pid_at - 1))) ::unlink(path.c_str());
}

// Another crun's claim on the directory, when it is alive (holds its lock): "pid P on host H
// (job J)". Dead claims and drafts are removed.
std::optional<std::string> LiveClaim(const fs::path& path, const std::string& job,
                                     std::string_view host) {
  if (path.filename().string().rfind(kClaimDraft, 0) == 0) {
    RemoveDeadDraft(path, host);
    return std::nullopt;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> live;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    ::unlink(path.c_str());  // its crun is gone
  } else if (errno == EWOULDBLOCK) {
    const std::string text = ReadSmallFile(fd);
    const auto nl = text.find('\n');
    const std::string who = text.substr(0, nl),
                      their_job = nl == std::string::npos ? std::string() : text.substr(nl + 1);
    if (job.empty() || their_job != job) {
      live = who + " (" + (their_job.empty() ? "a job of its own" : "job " + their_job) + ")";
    }
  }
  ::close(fd);
  return live;
}

}  // namespace

std::string SnapshotFilePath(const std::string& dir, std::uint64_t step, std::int64_t rank) {
  char name[64];
  std::snprintf(name, sizeof name, "/step-%012llu/rank-%05lld.snap",
                static_cast<unsigned long long>(step), static_cast<long long>(rank));
  return dir + name;
}

std::vector<std::uint64_t> StepsToDrop(const std::vector<std::uint64_t>& steps,
                                       std::optional<std::uint64_t> job_step, int keep) {
  keep = std::max(keep, 1);
  std::vector<std::uint64_t> drop;
  int held = 0, ahead = 0;
  for (std::uint64_t step : steps) {
    const bool counted = job_step && step <= *job_step;
    if (counted ? ++held > keep : ++ahead > keep + kStepsAhead) drop.push_back(step);
  }
  return drop;
}

bool ChoosesStep(std::uint64_t step, std::uint64_t every, const std::uint64_t* last) {
  if (last == nullptr) return true;
  if (every == 0 || step <= *last) return false;
  return step / every > *last / every;
}

DiskSnapshots::DiskSnapshots(SnapshotDiskOptions options) : options_(std::move(options)) {}

DiskSnapshots::~DiskSnapshots() {
  if (claim_fd_ < 0) return;
  ::unlink(claim_.c_str());
  ::close(claim_fd_);
}

// The claim: DIR/.crun-claim-<host>-<pid>, holding "pid P on host H" and the job, locked
// (flock) for as long as this crun lives, so that a crun killed with SIGKILL lets go of it. It
// is written under a draft name and renamed, so that a claim is never seen half written.
Status DiskSnapshots::Claim() {
  const std::string& dir = options_.dir;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  static std::atomic<int> claims{0};  // one process may hold several (the unit tests)
  const std::string me =
      std::string(host) + "-" + std::to_string(::getpid()) + "-" + std::to_string(claims++);
  const std::string draft = dir + "/" + std::string(kClaimDraft) + me;
  const int fd = ::open(draft.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return PosixError("--checkpoint-dir " + dir + ": crun cannot write there", errno,
                      StatusCode::kInvalidArgument);
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(draft.c_str());
    return PosixError("--checkpoint-dir " + dir +
                          ": its file system takes no locks, so crun cannot make sure that no "
                          "other job writes there",
                      err, StatusCode::kInvalidArgument);
  }
  const std::string text =
      "pid " + std::to_string(::getpid()) + " on host " + host + "\n" + options_.job;
  const std::string path = dir + "/" + std::string(kClaimPrefix) + me;
  Status s =
      WriteWhole(fd, reinterpret_cast<const unsigned char*>(text.data()), text.size(), draft);
  if (s.ok() && ::rename(draft.c_str(), path.c_str()) != 0)
    s = PosixError("renaming " + draft, errno);
  if (!s.ok()) {
    ::close(fd);
    ::unlink(draft.c_str());
    return s;
  }
  claim_ = path;
  claim_fd_ = fd;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kClaimPrefix, 0) != 0 || e.path() == path) continue;
    if (auto other = LiveClaim(e.path(), options_.job, host)) {
      ::unlink(claim_.c_str());
      ::close(std::exchange(claim_fd_, -1));
      return Status(StatusCode::kInvalidArgument,
                    "--checkpoint-dir " + dir + " is in use by another job: crun " + *other +
                        " writes its snapshots there, and two jobs in one directory would "
                        "overwrite each other's; give this job a directory of its own");
    }
  }
  return Status::Ok();
}

Status DiskSnapshots::Prepare() {
  const std::string& dir = options_.dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return Status(StatusCode::kInvalidArgument,
                  "--checkpoint-dir " + dir + ": cannot create it: " + ec.message());
  }
  CRUN_RETURN_IF_ERROR(Claim());
  RemoveStaleTemporaries(dir);
  return Status::Ok();
}

bool DiskSnapshots::Choose(int local_rank, std::uint64_t step) {
  std::lock_guard lock(mu_);
  const auto it = chosen_.find(local_rank);
  if (!ChoosesStep(step, options_.every, it == chosen_.end() ? nullptr : &it->second)) {
    return false;
  }
  chosen_[local_rank] = step;
  return true;
}

Status DiskSnapshots::Write(const std::vector<unsigned char>& staged) {
  snap::BufferHeader h;
  std::memcpy(&h, staged.data(), sizeof h);
  const std::string path = SnapshotFilePath(options_.dir, h.step, h.rank);
  const std::string step_dir = fs::path(path).parent_path().string();
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec) return Unavailable("creating " + step_dir + ": " + ec.message());
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return PosixError("creating " + tmp, errno);
  Status s = WriteWhole(fd, staged.data(), staged.size(), tmp);
  if (s.ok() && ::fsync(fd) != 0) s = PosixError("flushing " + tmp, errno);
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = PosixError("renaming " + tmp, errno);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  CRUN_RETURN_IF_ERROR(SyncDir(step_dir));
  // The steps StepsToDrop names go, of every rank of this node (the job's step may have moved
  // for the others too); a step directory goes with its last file.
  const auto job_step = JobStep(h.rank);
  std::int64_t first = h.rank, end = h.rank + 1;
  {
    std::lock_guard lock(mu_);
    if (round_.local_ranks > 0) {
      first = round_.base_rank;
      end = round_.base_rank + round_.local_ranks;
    }
  }
  for (std::int64_t rank = first; rank < end; ++rank) {
    for (std::uint64_t step :
         StepsToDrop(StepsWithRank(options_.dir, rank), job_step, options_.keep)) {
      const std::string old = SnapshotFilePath(options_.dir, step, rank);
      ::unlink(old.c_str());
      ::rmdir(fs::path(old).parent_path().c_str());  // fails, harmlessly, while others are there
    }
  }
  std::lock_guard lock(mu_);
  ++counters_.written;
  counters_.bytes += staged.size();
  counters_.last_step = std::max(counters_.last_step, h.step);
  return Status::Ok();
}

void DiskSnapshots::NewRound(DiskRound round) {
  std::lock_guard lock(mu_);
  round_ = std::move(round);
}

std::optional<std::uint64_t> DiskSnapshots::JobStep(std::int64_t written_rank) {
  DiskRound round;
  {
    std::lock_guard lock(mu_);
    round = round_;
  }
  const auto newest = [&](std::int64_t rank) -> std::optional<std::uint64_t> {
    const auto steps = StepsWithRank(options_.dir, rank);
    if (steps.empty()) return std::nullopt;
    return steps.front();
  };
  if (round.local_ranks <= 0) return newest(written_rank);  // no round: this rank alone
  // This node's: the oldest of its ranks' newest.
  std::optional<std::uint64_t> node;
  for (std::int64_t r = round.base_rank; r < round.base_rank + round.local_ranks; ++r) {
    const auto step = newest(r);
    if (!step) return Remembered(std::nullopt);
    node = node ? std::min(*node, *step) : *step;
  }
  if (round.nodes <= 1) return Remembered(node);
  if (round.store_host.empty()) return Remembered(std::nullopt);
  // The job's: the oldest of the nodes' newest, through the round's store.
  TcpStoreClientOptions o;
  o.host = round.store_host;
  o.port = round.store_port;
  o.connect_timeout = std::chrono::seconds(1);
  o.timeout = std::chrono::seconds(2);
  auto store = TcpStoreClient::Connect(o);
  if (!store.ok()) return Remembered(std::nullopt);
  std::vector<std::string> keys;
  for (int g = 0; g < round.nodes; ++g) keys.push_back(std::string(kDiskKey) + std::to_string(g));
  const std::string& mine = keys[static_cast<std::size_t>(round.group_rank)];
  if (!(*store)->Set(mine, std::to_string(*node)).ok()) {
    return Remembered(std::nullopt);
  }
  const auto all_there = (*store)->Check(keys);
  if (!all_there.ok() || !*all_there) return Remembered(std::nullopt);
  const auto values = (*store)->MultiGet(keys);
  if (!values.ok()) return Remembered(std::nullopt);
  std::optional<std::uint64_t> job;
  for (const std::string& v : *values) {
    const auto step = ParseInteger(v, 0, INT64_MAX);
    if (!step) return Remembered(std::nullopt);
    job =
        job ? std::min(*job, static_cast<std::uint64_t>(*step)) : static_cast<std::uint64_t>(*step);
  }
  return Remembered(job);
}

std::optional<std::uint64_t> DiskSnapshots::Remembered(std::optional<std::uint64_t> seen) {
  std::lock_guard lock(mu_);
  if (seen && (!job_step_ || *seen > *job_step_)) job_step_ = seen;
  return job_step_;
}

std::vector<std::uint64_t> DiskSnapshots::Steps(std::int64_t rank, std::int64_t world_size) const {
  std::vector<std::uint64_t> out;
  if (!options_.resume || options_.dir.empty()) return out;
  for (std::uint64_t step : StepsWithRank(options_.dir, rank)) {
    snap::BufferHeader h;
    if (!ReadHeader(SnapshotFilePath(options_.dir, step, rank), &h)) continue;
    if (h.step != step || h.rank != rank) continue;
    if (h.layout == snap::kSharded && h.world_size != world_size) continue;
    out.push_back(step);
  }
  return out;
}

StatusOr<int> DiskSnapshots::Restore(NodeSnapshots& memory, int local_rank, std::int64_t rank,
                                     std::uint64_t step) {
  const std::string path = SnapshotFilePath(options_.dir, step, rank);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return PosixError("opening " + path, errno, StatusCode::kNotFound);
  // Read at `offset` until `n` bytes are in `dst`: straight into crun's memory for the payload.
  const auto read_at = [&](unsigned char* dst, std::uint64_t n, std::uint64_t offset) {
    std::uint64_t got = 0;
    while (got < n) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(n - got, 1 << 30));
      const ssize_t r = ::pread(fd.get(), dst + got, want, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return PosixError("reading " + path, errno);
      if (r == 0) return InvalidArgument(path + " is not a crun snapshot (cut short)");
      got += static_cast<std::uint64_t>(r);
    }
    return Status::Ok();
  };
  struct stat st {};
  snap::BufferHeader from{};
  if (::fstat(fd.get(), &st) != 0 || st.st_size < static_cast<off_t>(snap::kHeaderBytes)) {
    return InvalidArgument(path + " is not a crun snapshot (too short)");
  }
  CRUN_RETURN_IF_ERROR(read_at(reinterpret_cast<unsigned char*>(&from), sizeof from, 0));
  if (static_cast<std::uint64_t>(st.st_size) != snap::kHeaderBytes + from.payload_bytes) {
    return InvalidArgument(path + " is not a crun snapshot of " + std::to_string(st.st_size) +
                           " bytes (cut short, or not one)");
  }
  auto index = memory.Fill(local_rank, from, [&](unsigned char* dst, std::uint64_t n) {
    return read_at(dst, n, snap::kHeaderBytes);
  });
  if (!index.ok()) return Status(index.status().code(), path + ": " + index.status().message());
  std::lock_guard lock(mu_);
  ++counters_.restored;
  return index;
}

DiskCounters DiskSnapshots::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

void DiskSnapshots::CountSkipped() {
  std::lock_guard lock(mu_);
  ++counters_.skipped;
}

void DiskSnapshots::CountFailed() {
  std::lock_guard lock(mu_);
  ++counters_.failed;
}

}  // namespace crun::agent
