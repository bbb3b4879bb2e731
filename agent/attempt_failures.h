// The running attempt's failures, in full (FailureRecord), and its hang: what the rendezvous
// and the failure report get. Each record is filled when its worker ends, so that it can
// travel to other nodes and be printed there the same way.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/attempt_start.h"
#include "agent/failure_report.h"
#include "agent/hangs/hang_report.h"

namespace crun::agent {

class AttemptFailures {
 public:
  // `host`: this node's name, in every record.
  explicit AttemptFailures(std::string host) : host_(std::move(host)) {}

  // A new attempt: nothing recorded, no hang.
  void Clear();
  // The records were reported and the node rejoins: none is this node's any more. The hang
  // stays, for a report of it that comes back from the rendezvous.
  void ClearRecords() { records_.clear(); }
  // Rank `rank` (local rank `lr`) could not be started: it failed with the shell's `code`.
  void LaunchFailed(int rank, int lr, int code, const std::string& why);
  // Worker `w` (rank `rank`) failed: how, its error file and its last lines so far. `oom`: the
  // OOM killer's words, or "".
  const FailureRecord& Exited(Worker& w, int rank, ExitStatus exit, std::string oom);
  // A hang was declared at `when`: the report that judged it.
  void NoteHang(HangReport report, std::chrono::system_clock::time_point when);
  // Worker `w` (rank `rank`) is one the hang judged hung: its record, in time order.
  void Hung(const Worker& w, int rank);
  // How hung worker `w` ended once stopped.
  void HangEnded(const Worker& w, ExitStatus exit);
  // The attempt is over: the records in time order, each with its stderr's last lines, now
  // complete (`tail` of a local rank).
  void Complete(const std::function<std::vector<std::string>(int lr)>& tail);

  const std::vector<FailureRecord>& records() const { return records_; }
  // The attempt's hang, when `report`'s root cause is one.
  const HangReport* HangBehind(const std::vector<FailureRecord>& report) const;

 private:
  FailureRecord New(int rank, int lr, ExitStatus exit) const;
  void SortByTime();

  std::string host_;
  std::vector<FailureRecord> records_;
  std::optional<HangReport> hang_;
  std::chrono::system_clock::time_point hang_when_;
};

}  // namespace crun::agent
