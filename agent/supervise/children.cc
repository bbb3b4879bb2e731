#include "agent/supervise/children.h"

#include <dirent.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <cerrno>
#include <fstream>
#include <string>

namespace crun::agent {

void ChildRegistry::Own(pid_t pid) {
  std::lock_guard<std::mutex> lock(mutex_);
  owned_.insert(pid);
}

pid_t ChildRegistry::Reap(pid_t pid, int* status, int flags) {
  pid_t r;
  do {
    r = ::waitpid(pid, status, flags);
  } while (r < 0 && errno == EINTR);
  if (r == pid) {
    std::lock_guard<std::mutex> lock(mutex_);
    owned_.erase(pid);
  }
  return r;
}

bool ChildRegistry::Owns(pid_t pid) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return owned_.count(pid) > 0;
}

std::vector<pid_t> ChildRegistry::Orphans() const {
  std::vector<pid_t> orphans;
  for (pid_t c : ChildrenOfSelf()) {
    if (!Owns(c)) orphans.push_back(c);
  }
  return orphans;
}

int ChildRegistry::ReapOrphans() {
  int reaped = 0;
  for (pid_t c : Orphans()) {
    int status = 0;
    if (::waitpid(c, &status, WNOHANG) == c) ++reaped;
  }
  return reaped;
}

std::vector<pid_t> ChildrenOfSelf() {
  std::vector<pid_t> out;
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return out;
  while (const dirent* t = ::readdir(tasks)) {
    if (t->d_name[0] == '.') continue;
    std::ifstream in(std::string("/proc/self/task/") + t->d_name + "/children");
    pid_t pid;
    while (in >> pid) out.push_back(pid);
  }
  ::closedir(tasks);
  return out;
}

Status BecomeSubreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return PosixError("PR_SET_CHILD_SUBREAPER", errno);
  return Status::Ok();
}

}  // namespace crun::agent
