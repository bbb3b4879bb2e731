#include "base/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>

namespace crun {

bool WriteWholeFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  return ::close(fd) == 0 && done == text.size();
}

bool ReplaceWholeFile(const std::string& path, const std::string& text) {
  const std::string draft = path + ".crun-" + std::to_string(::getpid());
  if (WriteWholeFile(draft, text) && ::rename(draft.c_str(), path.c_str()) == 0) return true;
  ::unlink(draft.c_str());
  return false;
}

std::string FindOnPath(const std::string& name, const std::string& path) {
  std::size_t start = 0;
  while (start <= path.size()) {
    const auto end = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, end - start);
    if (!dir.empty() && dir.front() == '/' && ::access((dir + "/" + name).c_str(), X_OK) == 0) {
      return dir + "/" + name;
    }
    start = end + 1;
  }
  return "";
}

}  // namespace crun
