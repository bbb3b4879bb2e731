#include "base/proc.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace crun {

std::optional<char> StateFromStat(std::string_view stat) {
  const auto close = stat.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat.size() || stat[close + 1] != ' ') {
    return std::nullopt;
  }
  return stat[close + 2];
}

std::optional<char> ProcessState(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  // The state comes after the command name (at most 64 bytes with the pid): 512 bytes hold it.
  char buf[512];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  return StateFromStat(std::string_view(buf, static_cast<std::size_t>(n)));
}

}  // namespace crun
