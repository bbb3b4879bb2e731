#include "agent/supervise/group_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <set>

#include "agent/supervise/children.h"
#include "agent/supervise/worker_cgroup.h"

namespace crun::agent {

StatusOr<std::unique_ptr<GroupGuard>> GroupGuard::Start(ChildRegistry& children,
                                                        const std::string& cgroup_dir) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return PosixError("pipe for the group guard", errno);
  const pid_t pid = ::fork();
  if (pid < 0) return PosixError("fork for the group guard", errno);
  if (pid == 0) {
    // The guard: its own session (a kill of crun's process group spares it), deaf to the
    // terminal's signals, holding nothing of crun's but the pipe.
    ::setsid();
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    ::signal(SIGQUIT, SIG_IGN);
    if (p[0] != 3) {
      ::dup2(p[0], 3);
    } else {
      ::fcntl(3, F_SETFD, 0);
    }
    ::close_range(4, ~0U, 0);
    ::close(STDIN_FILENO);
    std::set<pid_t> groups;
    std::int32_t message;
    for (;;) {
      const ssize_t n = ::read(3, &message, sizeof message);
      if (n == sizeof message) {
        if (message > 0) groups.insert(message);
        if (message < 0) groups.erase(-message);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      break;  // EOF: crun is gone (or done)
    }
    for (pid_t g : groups) ::kill(-g, SIGKILL);
    if (!cgroup_dir.empty()) KillAndRemoveCgroup(cgroup_dir);
    ::_exit(0);
  }
  children.Own(pid);
  ::close(p[0]);
  return std::unique_ptr<GroupGuard>(new GroupGuard(children, pid, p[1]));
}

GroupGuard::~GroupGuard() {
  ::close(fd_);  // the guard kills whatever is still registered, then exits
  int status;
  children_.Reap(pid_, &status, 0);
}

void GroupGuard::Send(std::int32_t message) {
  ssize_t n;
  do {
    n = ::write(fd_, &message, sizeof message);
  } while (n < 0 && errno == EINTR);
}

void GroupGuard::Add(pid_t pgid) { Send(static_cast<std::int32_t>(pgid)); }
void GroupGuard::Forget(pid_t pgid) { Send(-static_cast<std::int32_t>(pgid)); }

}  // namespace crun::agent
