// Telling a worker killed by the kernel's OOM killer from any other SIGKILL (docs/hangs.md,
// "The OOM killer"). Two witnesses, the first that speaks wins:
// * the kernel log (/dev/kmsg, readable by root or where dmesg_restrict is 0): "Killed process
//   <pid> (<name>) total-vm:..., anon-rss:<n>kB, file-rss:<n>kB, shmem-rss:<n>kB", for a
//   machine-wide OOM and a cgroup's alike; it names the pid and its RSS;
// * crun's memory cgroup's OOM-kill counter (cgroup v2 memory.events, v1 memory.oom_control),
//   which rises when the kernel killed a process of the cgroup for want of memory: no pid, but
//   no privilege needed either.
// Reads only what appeared since the agent started: records older than crun are never matched.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace crun::agent {

struct OomKill {
  std::int64_t rss_kib = -1;  // -1: unknown
  std::string witness;        // "kernel log", "cgroup memory.events"
  // "killed by the OOM killer (RSS 1.2 GiB, from the kernel log)"
  std::string Describe() const;
};

// The RSS of a "Killed process" line of the kernel log, and its pid; nothing for other lines.
std::optional<std::pair<pid_t, std::int64_t>> ParseOomKillLine(const std::string& message);

class OomWatch {
 public:
  // `cgroup_dir`: crun's worker cgroup (v2), "" when none. Never fails: a witness that cannot
  // be read is left out.
  explicit OomWatch(const std::string& cgroup_dir);
  ~OomWatch();
  OomWatch(const OomWatch&) = delete;
  OomWatch& operator=(const OomWatch&) = delete;

  // Called when `pid` (a worker) died of SIGKILL.
  std::optional<OomKill> Check(pid_t pid);
  // Whether any witness can be read here (for the log at start).
  bool has_witness() const { return kmsg_ >= 0 || !counters_.empty(); }

 private:
  void ReadKernelLog();
  int kmsg_ = -1;
  std::map<pid_t, std::int64_t> killed_;          // from the kernel log: pid -> RSS KiB
  std::map<std::string, std::int64_t> counters_;  // counter file -> value last seen
};

}  // namespace crun::agent
