// The running attempt's failures, in full (a report::FailureReport of this node), and its hang:
// what the rendezvous and the failure report get. Each record is filled when its worker ends,
// so that it can travel to other nodes and be printed there the same way.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/failures/report_format.h"
#include "agent/hangs/hang_report.h"
#include "agent/workers/attempt_start.h"

namespace crun::agent {

class AttemptFailures {
 public:
  // `host`: this node's name, the report's.
  explicit AttemptFailures(std::string host) { report_.host = std::move(host); }

  // A new attempt: nothing recorded, no hang.
  void Clear();
  // The records were reported and the node rejoins: none is this node's any more. The hang
  // stays, for a report of it that comes back from the rendezvous.
  void ClearRecords() { report_.failures.clear(); }
  // Rank `rank` (local rank `lr`) could not be started: it failed with the shell's `code`.
  void LaunchFailed(int rank, int lr, int code, const std::string& why);
  // Worker `w` (rank `rank`) failed: how, its error file and its last lines so far. `oom`: the
  // OOM killer's words, or "".
  const report::WorkerFailure& Exited(Worker& w, int rank, ExitStatus exit, std::string oom);
  // A hang was declared at `when`: the report that judged it.
  void NoteHang(HangReport report, std::chrono::system_clock::time_point when);
  // Local rank `lr` was named slow at `when` (--straggler-action restart): `why`, its ratio.
  void NoteSlow(int lr, std::string why, std::chrono::system_clock::time_point when);
  // Worker `w` (rank `rank`) is one crun declared failed, hung (by the hang noted) or slow (as
  // noted): its record, in time order.
  void Hung(const Worker& w, int rank);
  // How worker `w`, declared hung or slow, ended once stopped.
  void HangEnded(const Worker& w, ExitStatus exit);
  // The attempt is over: the records in time order, each with its stderr's last lines, now
  // complete (`tail` of a local rank).
  void Complete(const std::function<std::vector<std::string>(int lr)>& tail);

  // This node's report (no node id: the rendezvous adds its own).
  const report::FailureReport& report() const { return report_; }
  // The attempt's hang, when `report`'s root cause is one.
  const HangReport* HangBehind(const report::FailureReport& report) const;

 private:
  static report::WorkerFailure New(int rank, int lr, ExitStatus exit);
  void SortByTime();

  report::FailureReport report_;
  std::optional<HangReport> hang_;
  std::int64_t hang_when_ms_ = 0;  // time_unix_ms of the hang
  struct Slow {
    std::string why;
    std::int64_t when_ms = 0;
  };
  std::map<int, Slow> slow_;  // local rank -> why crun stops it as slow
};

// Logs that the failure `f` (the worker ended with `exit`, on `host`) stops the rest of its
// group of `group_size` workers on this node.
void WarnStopping(const report::WorkerFailure& f, const ExitStatus& exit, const std::string& host,
                  int group_size);

}  // namespace crun::agent
