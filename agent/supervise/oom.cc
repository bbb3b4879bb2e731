#include "agent/supervise/oom.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace crun::agent {
namespace {

// A small /proc or /sys file (plain read(): no iostreams on the way to starting workers).
std::string ReadSmall(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  ssize_t n;
  while (out.size() < (1 << 16) && (n = ::read(fd, buf, sizeof buf)) > 0) {
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// "<name> <n>" from a flat-keyed cgroup file (memory.events, memory.oom_control); -1 if absent.
std::int64_t ReadCounter(const std::string& file, const std::string& name) {
  const std::string text = ReadSmall(file);
  const std::string key = name + " ";
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    if (text.compare(at, key.size(), key) == 0) {
      return std::strtoll(text.c_str() + at + key.size(), nullptr, 10);
    }
    at = end + 1;
  }
  return -1;
}

// The number before "kB" after `key` in `text`, else 0.
std::int64_t KiBAfter(const std::string& text, const std::string& key) {
  const auto at = text.find(key);
  if (at == std::string::npos) return 0;
  return std::strtoll(text.c_str() + at + key.size(), nullptr, 10);
}

// crun's own memory cgroup, v1 (the "memory" controller's line of /proc/self/cgroup).
std::string MemoryCgroupV1() {
  const std::string text = ReadSmall("/proc/self/cgroup");
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);  // "4:memory:/path"
    at = end + 1;
    const auto first = line.find(':');
    const auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    if (controllers.find(",memory,") != std::string::npos) {
      return "/sys/fs/cgroup/memory" + line.substr(second + 1);
    }
  }
  return "";
}

}  // namespace

std::string OomKill::Describe() const {
  std::string out = "killed by the OOM killer";
  std::string rss;
  if (rss_kib >= 0) {
    char text[48];
    if (rss_kib >= (1 << 20)) {
      std::snprintf(text, sizeof text, "RSS %.1f GiB", static_cast<double>(rss_kib) / (1 << 20));
    } else {
      std::snprintf(text, sizeof text, "RSS %.0f MiB", static_cast<double>(rss_kib) / (1 << 10));
    }
    rss = text;
  }
  return out + " (" + (rss.empty() ? "" : rss + ", ") + "from the " + witness + ")";
}

std::optional<std::pair<pid_t, std::int64_t>> ParseOomKillLine(const std::string& message) {
  static const std::string kMarker = "Killed process ";
  const auto at = message.find(kMarker);
  if (at == std::string::npos) return std::nullopt;
  char* end = nullptr;
  const long pid = std::strtol(message.c_str() + at + kMarker.size(), &end, 10);
  if (pid <= 0 || end == message.c_str() + at + kMarker.size()) return std::nullopt;
  const std::int64_t rss = KiBAfter(message, "anon-rss:") + KiBAfter(message, "file-rss:") +
                           KiBAfter(message, "shmem-rss:");
  return std::make_pair(static_cast<pid_t>(pid), rss);
}

OomWatch::OomWatch(const std::string& cgroup_dir) {
  kmsg_ = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (kmsg_ >= 0 && ::lseek(kmsg_, 0, SEEK_END) < 0) {
    ::close(kmsg_);
    kmsg_ = -1;
  }
  auto add = [&](const std::string& file, const std::string& name) {
    const std::int64_t v = ReadCounter(file, name);
    if (v >= 0) counters_[file] = v;
  };
  if (!cgroup_dir.empty()) add(cgroup_dir + "/memory.events", "oom_kill");
  if (const std::string v1 = MemoryCgroupV1(); !v1.empty()) {
    add(v1 + "/memory.oom_control", "oom_kill");
  }
}

OomWatch::~OomWatch() {
  if (kmsg_ >= 0) ::close(kmsg_);
}

void OomWatch::ReadKernelLog() {
  if (kmsg_ < 0) return;
  char record[8192];
  for (int records = 0; records < 100000; ++records) {
    const ssize_t n = ::read(kmsg_, record, sizeof record - 1);
    if (n < 0 && errno == EPIPE) continue;  // records were overwritten: go on with the next
    if (n <= 0) return;                     // EAGAIN: nothing more (or unreadable)
    const std::string text(record, static_cast<std::size_t>(n));
    const auto semicolon = text.find(';');
    if (semicolon == std::string::npos) continue;
    if (auto kill = ParseOomKillLine(text.substr(semicolon + 1)))
      killed_[kill->first] = kill->second;
  }
}

std::optional<OomKill> OomWatch::Check(pid_t pid) {
  ReadKernelLog();
  if (const auto it = killed_.find(pid); it != killed_.end()) {
    return OomKill{it->second, "kernel log"};
  }
  std::optional<OomKill> found;
  for (auto& [file, seen] : counters_) {
    const std::int64_t now = ReadCounter(file, "oom_kill");
    if (now > seen && !found) {
      found = OomKill{-1, "cgroup's " + file.substr(file.rfind('/') + 1)};
    }
    seen = std::max(seen, now);
  }
  return found;
}

}  // namespace crun::agent
