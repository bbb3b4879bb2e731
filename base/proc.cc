#include "base/proc.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace crun {

std::optional<char> StateFromStat(std::string_view stat) {
  const auto close = stat.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat.size() || stat[close + 1] != ' ') {
    return std::nullopt;
  }
  return stat[close + 2];
}

namespace {

// The start of /proc/<pid>/stat; empty when it cannot be read.
std::string ReadStat(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  // The state and parent come after the command name (at most 64 bytes with the pid): 512
  // bytes hold them.
  char buf[512];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return {};
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace

std::optional<char> ProcessState(pid_t pid) {
  const std::string stat = ReadStat(pid);
  if (stat.empty()) return std::nullopt;
  return StateFromStat(stat);
}

std::optional<pid_t> ParentOf(pid_t pid) {
  const std::string stat = ReadStat(pid);
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 4 >= stat.size()) return std::nullopt;
  const char* start = stat.c_str() + close + 4;  // ") S <ppid> ..."
  char* end = nullptr;
  const long parent = std::strtol(start, &end, 10);
  if (end == start || parent < 0) return std::nullopt;
  return static_cast<pid_t>(parent);
}

}  // namespace crun
