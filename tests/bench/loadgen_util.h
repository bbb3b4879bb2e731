// What the rendezvous load generator's two modes share (rdzv_loadgen.cc, rdzv_loadgen_etcd.cc):
// reading a process's CPU time and memory from /proc, and counting agents that reached a goal.
#pragma once

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace crun::bench {

struct ProcStat {
  double cpu_s = 0;  // user + system
  double rss_mib = 0;
  double hwm_mib = 0;
};

inline ProcStat ReadProc(int pid) {
  ProcStat p;
  if (pid <= 0) return p;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const auto close = text.rfind(')');
  if (close == std::string::npos) return p;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; rest >> field; ++i) {  // field 3 is the state
    if (i == 14) utime = std::stol(field);
    if (i == 15) {
      stime = std::stol(field);
      break;
    }
  }
  p.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) p.rss_mib = std::stod(line.substr(6)) / 1024;
    if (line.rfind("VmHWM:", 0) == 0) p.hwm_mib = std::stod(line.substr(6)) / 1024;
  }
  return p;
}

// The sum over several processes (the members of an etcd cluster).
inline ProcStat ReadProcs(const std::vector<int>& pids) {
  ProcStat sum;
  for (int pid : pids) {
    const ProcStat p = ReadProc(pid);
    sum.cpu_s += p.cpu_s;
    sum.rss_mib += p.rss_mib;
    sum.hwm_mib += p.hwm_mib;
  }
  return sum;
}

// Counts agents that reached a phase's goal; the main thread waits for all of them.
class Tally {
 public:
  void Reset(int goal) {
    std::lock_guard lock(mu_);
    goal_ = goal;
    count_ = 0;
  }
  void Hit() {
    std::lock_guard lock(mu_);
    if (++count_ >= goal_) cv_.notify_all();
  }
  // The number reached: the goal unless the deadline passed first.
  int Wait(std::chrono::milliseconds limit) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, limit, [&] { return count_ >= goal_; });
    return count_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int goal_ = 0;
  int count_ = 0;
};

}  // namespace crun::bench
