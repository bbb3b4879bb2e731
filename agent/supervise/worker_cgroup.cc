#include "agent/supervise/worker_cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>

namespace crun::agent {
namespace {

// The cgroup2 mount point, from /proc/self/mountinfo.
std::string Cgroup2Mount() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream after(line.substr(dash + 3));
    std::string type;
    after >> type;
    if (type != "cgroup2") continue;
    std::istringstream fields(line);
    std::string id, parent, dev, root, mount;
    fields >> id >> parent >> dev >> root >> mount;
    return mount;
  }
  return {};
}

// This process's cgroup2 path ("0::/some/path" in /proc/self/cgroup).
std::string OwnCgroup2Path() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return {};
}

}  // namespace

std::string OwnCgroupDir() {
  const std::string mount = Cgroup2Mount();
  if (mount.empty()) return {};
  const std::string own = OwnCgroup2Path();
  return own == "/" ? mount : mount + own;
}

namespace {

std::vector<pid_t> Procs(const std::string& dir) {
  std::vector<pid_t> out;
  std::ifstream in(dir + "/cgroup.procs");
  pid_t pid;
  while (in >> pid) out.push_back(pid);
  return out;
}

bool WriteFile(const std::string& path, const char* text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text, std::strlen(text)) == static_cast<ssize_t>(std::strlen(text));
  ::close(fd);
  return ok;
}

// The cgroups directly below `dir` (the attempts', the warm template's, any a worker made).
std::vector<std::string> Children(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_type != DT_DIR || std::strcmp(e->d_name, ".") == 0 ||
        std::strcmp(e->d_name, "..") == 0) {
      continue;
    }
    out.push_back(dir + "/" + e->d_name);
  }
  ::closedir(d);
  return out;
}

// SIGKILL to everything in `dir` and below: cgroup.kill, else (before Linux 5.14) one by one.
void Kill(const std::string& dir) {
  if (WriteFile(dir + "/cgroup.kill", "1")) return;
  for (pid_t p : Procs(dir)) ::kill(p, SIGKILL);
  for (const auto& c : Children(dir)) Kill(c);
}

// rmdir of `dir`, its children first: whether it is gone. Each rmdir fails (EBUSY) while a
// live process is in that cgroup; zombies do not count.
bool RemoveTree(const std::string& dir) {
  for (const auto& c : Children(dir)) RemoveTree(c);
  return ::rmdir(dir.c_str()) == 0 || errno == ENOENT;
}

}  // namespace

StatusOr<std::unique_ptr<WorkerCgroup>> WorkerCgroup::Create() {
  if (const char* opt = std::getenv("CRUN_CGROUP"); opt != nullptr && std::string(opt) == "0") {
    return Unavailable("CRUN_CGROUP=0");
  }
  const std::string mount = Cgroup2Mount();
  if (mount.empty()) return Unavailable("no cgroup2 file system is mounted");
  std::string own = OwnCgroup2Path();
  if (own == "/") own.clear();
  const std::string name = mount + own + "/crun-" + std::to_string(::getpid());
  std::string dir = name;
  if (::mkdir(dir.c_str(), 0755) != 0) {
    if (errno != EEXIST) return PosixError("cannot create " + dir, errno, StatusCode::kUnavailable);
    // An earlier crun's, whose pid this one has now: SIGKILLed, and its guard could not remove
    // it (itself killed, or its workers slow to leave), or has not yet: a guard still at it
    // would end whatever is in that directory, so this crun takes a name of its own. The old
    // one goes if nothing is in it; one holding processes is left alone.
    const bool removed = RemoveTree(name);
    int err = EEXIST;
    for (int n = 1; n <= 16 && err == EEXIST; ++n) {
      dir = name + "-" + std::to_string(n);
      err = ::mkdir(dir.c_str(), 0755) == 0 ? 0 : errno;
    }
    if (err != 0) return PosixError("cannot create " + dir, err, StatusCode::kUnavailable);
    spdlog::info("cgroup {} was an earlier crun's with this pid ({}); this one's is {}", name,
                 removed ? "empty: removed" : "processes still in it: left alone", dir);
  }
  return std::unique_ptr<WorkerCgroup>(new WorkerCgroup(dir));
}

WorkerCgroup::~WorkerCgroup() {
  if (!KillAndRemoveCgroup(dir_)) {
    std::string left;
    for (pid_t p : agent::Procs(dir_)) left += " " + std::to_string(p);
    spdlog::warn("cannot remove the workers' cgroup {} within {} s; still in it:{}", dir_,
                 kCgroupRemoveDeadline.count(), left.empty() ? " (in a cgroup below it)" : left);
  }
}

StatusOr<std::unique_ptr<AttemptCgroup>> AttemptCgroup::Create(const WorkerCgroup& parent,
                                                               int attempt) {
  return Create(parent, "attempt-" + std::to_string(attempt));
}

StatusOr<std::unique_ptr<AttemptCgroup>> AttemptCgroup::Create(const WorkerCgroup& parent,
                                                               const std::string& name) {
  const std::string dir = parent.dir() + "/" + name;
  if (::mkdir(dir.c_str(), 0755) != 0) return PosixError("cannot create cgroup " + dir, errno);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    ::rmdir(dir.c_str());
    return PosixError("cannot open cgroup " + dir, err);
  }
  return std::unique_ptr<AttemptCgroup>(new AttemptCgroup(dir, fd));
}

AttemptCgroup::~AttemptCgroup() {
  ::close(fd_);
  if (!removed_) ::rmdir(dir_.c_str());
}

void AttemptCgroup::KillAll() const { Kill(dir_); }

std::vector<pid_t> AttemptCgroup::Procs() const { return agent::Procs(dir_); }

bool AttemptCgroup::Populated() const {
  std::ifstream in(dir_ + "/cgroup.events");
  std::string key, value;
  while (in >> key >> value) {
    if (key == "populated") return value != "0";
  }
  return !Procs().empty();
}

Status AttemptCgroup::Remove() {
  if (removed_) return Status::Ok();
  if (::rmdir(dir_.c_str()) != 0 && errno != ENOENT) {
    return PosixError("cannot remove cgroup " + dir_, errno);
  }
  removed_ = true;
  return Status::Ok();
}

bool KillAndRemoveCgroup(const std::string& dir) {
  // Killed processes leave the cgroup as they exit (reaped by crun, or by init for the orphans
  // of a dead crun), which takes a moment on a loaded machine: retry until the deadline.
  const auto deadline = std::chrono::steady_clock::now() + kCgroupRemoveDeadline;
  for (;;) {
    if (RemoveTree(dir)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    Kill(dir);
    ::poll(nullptr, 0, 10);
  }
}

}  // namespace crun::agent
