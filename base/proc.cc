#include "base/proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
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

std::vector<Mapping> ReleasableMappings(std::string_view smaps) {
  std::vector<Mapping> out;
  std::istringstream in{std::string(smaps)};
  std::optional<Mapping> current;  // a candidate until its Anonymous line says otherwise
  bool anonymous = false;
  auto flush = [&] {
    if (current && !anonymous && current->rss_kib > 0) out.push_back(*current);
    current.reset();
    anonymous = false;
  };
  for (std::string line; std::getline(in, line);) {
    const auto dash = line.find('-');
    const auto space = line.find(' ');
    const bool header = dash != std::string::npos && space != std::string::npos && dash < space &&
                        line.find(':') > space;
    if (header) {
      flush();
      std::istringstream h(line);
      std::string range, perms, offset, dev, inode, path;
      h >> range >> perms >> offset >> dev >> inode >> path;
      // Read-only, private, backed by a file (not [vdso], [heap], anonymous memory).
      if (perms.size() == 4 && perms[0] == 'r' && perms[1] == '-' && perms[3] == 'p' &&
          !path.empty() && path[0] == '/') {
        Mapping m;
        m.start = std::strtoull(range.substr(0, dash).c_str(), nullptr, 16);
        m.end = std::strtoull(range.substr(dash + 1).c_str(), nullptr, 16);
        if (m.end > m.start) current = m;
      }
      continue;
    }
    if (!current) continue;
    std::istringstream f(line);
    std::string key;
    std::size_t kib = 0;
    f >> key >> kib;
    if (key == "Rss:") current->rss_kib = kib;
    if (key == "Anonymous:" && kib > 0) anonymous = true;  // a private copy (RELRO)
    if (key == "VmFlags:" && line.find(" lo") != std::string::npos) anonymous = true;  // locked
  }
  flush();
  return out;
}

std::size_t ReleaseStartupPages() {
  std::ifstream in("/proc/self/smaps");
  if (!in) return 0;
  std::stringstream text;
  text << in.rdbuf();
  std::size_t released = 0;
  for (const auto& m : ReleasableMappings(text.str())) {
    if (::madvise(reinterpret_cast<void*>(m.start), m.end - m.start, MADV_DONTNEED) == 0) {
      released += m.rss_kib * 1024;
    }
  }
  return released;
}

std::vector<std::uint64_t> SocketInodesOnPort(std::string_view proc_net_tcp, std::uint16_t port) {
  std::vector<std::uint64_t> out;
  std::istringstream in{std::string(proc_net_tcp)};
  std::string line;
  std::getline(in, line);  // the column names
  while (std::getline(in, line)) {
    // "  0: 0100007F:5113 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 4711 ..."
    std::istringstream f(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    if (!(f >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode)) {
      continue;
    }
    const auto colon = local.rfind(':');
    if (colon == std::string::npos) continue;
    char* end = nullptr;
    const unsigned long p = std::strtoul(local.c_str() + colon + 1, &end, 16);
    if (*end != '\0' || p != port) continue;
    const unsigned long long n = std::strtoull(inode.c_str(), &end, 10);
    if (*end == '\0' && n != 0) out.push_back(n);
  }
  return out;
}

namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  return text.str();
}

// Whether one of the open files of `pid` is a socket in `inodes`.
bool HoldsSocket(const std::string& pid, const std::vector<std::uint64_t>& inodes) {
  const std::string fds = "/proc/" + pid + "/fd";
  DIR* dir = ::opendir(fds.c_str());
  if (dir == nullptr) return false;
  bool found = false;
  while (const dirent* e = ::readdir(dir)) {
    char target[64];
    const std::string link = fds + "/" + e->d_name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    unsigned long long inode = 0;
    if (std::sscanf(target, "socket:[%llu]", &inode) == 1 &&
        std::find(inodes.begin(), inodes.end(), inode) != inodes.end()) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

}  // namespace

std::vector<PortHolder> TcpPortHolderList(std::uint16_t port) {
  std::vector<std::uint64_t> inodes = SocketInodesOnPort(ReadAll("/proc/net/tcp"), port);
  for (auto i : SocketInodesOnPort(ReadAll("/proc/net/tcp6"), port)) inodes.push_back(i);
  std::vector<PortHolder> out;
  if (inodes.empty()) return out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (const dirent* e = ::readdir(proc)) {
    const std::string pid = e->d_name;
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit)) continue;
    if (!HoldsSocket(pid, inodes)) continue;
    std::string comm = ReadAll("/proc/" + pid + "/comm");
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    out.push_back({static_cast<pid_t>(std::stol(pid)), std::move(comm)});
  }
  ::closedir(proc);
  return out;
}

std::string TcpPortHolders(std::uint16_t port) {
  std::string out;
  for (const PortHolder& h : TcpPortHolderList(port)) {
    if (!out.empty()) out += ", ";
    out += "pid " + std::to_string(h.pid) + " (" + h.name + ")";
  }
  return out;
}

}  // namespace crun
