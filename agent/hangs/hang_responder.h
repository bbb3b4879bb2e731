// What the agent does once a rank is hung (docs/hangs.md): while every rank still runs, it asks
// NCCL's flight recorder for its traces, reads every rank's stacks here and, through the
// rendezvous, on every other node, then tells the rank that holds the others up from those
// waiting for it, prints the report and keeps it (attempt_<n>/hang.json, stacks/rank_<r>.txt).
// Stopping the group is the lifecycle's to decide: `concluded` hands it the report.
//
// Also the one place stacks are read: a hang, `crun stacks` and another node's request share
// the capture under way.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/hangs/hang_report.h"
#include "agent/hangs/hang_watch.h"
#include "agent/hangs/stack_capture.h"

namespace crun::agent {

struct HangResponderOptions {
  std::string host_name;
  std::string entrypoint;                            // the script or program, for the banner
  std::string log_dir;                               // attempt_<n>/ below it
  std::chrono::milliseconds stack_deadline{10'000};  // per rank and tool
  std::string tool_path;                             // crun's PATH, for the stack tools
  std::string program_dir;                           // the workers' program's, for py-spy
};

// The attempt a hang belongs to, as the report names it.
struct HangAttempt {
  int attempt = 0;  // the lifecycle's
  int round = 0;
  int restart_count = 0;
  int base_rank = 0;
  std::string run_id;
};

class HangResponder {
 public:
  // The running ranks of this node, now.
  using Targets = std::function<std::vector<StackTarget>()>;
  // The stacks of every other node (Rendezvous::AskStacks).
  using AskRemote = std::function<void(const std::string& why, std::chrono::milliseconds timeout,
                                       std::function<void(RemoteStacks)> done)>;
  // Whether `attempt` still runs (a hang of an attempt that ended is dropped).
  using IsCurrent = std::function<bool(int attempt)>;
  // The report of a hang of `attempt`, declared at `when` (`declared` on the steady clock).
  using Concluded =
      std::function<void(int attempt, HangReport report, std::chrono::system_clock::time_point when,
                         std::chrono::steady_clock::time_point declared)>;

  // The stack tools run as children owned in `children`, which must outlive the responder.
  HangResponder(boost::asio::io_context& io, ChildRegistry& children, HangResponderOptions options,
                Targets targets, AskRemote ask_remote, IsCurrent is_current, Concluded concluded);

  // A hang was declared in `attempt`; nothing happens while one is being gathered.
  void OnHang(const HangAttempt& attempt, const std::vector<WorkerProgress>& progress);
  // Reads every running rank's stacks, once for all who ask meanwhile.
  void ReadStacks(std::function<void(const std::vector<RankStacks>&)> done);
  // Another node's hang: this node's stacks, printed and kept under attempt `round`.
  void ShowForOtherNode(int round, const std::string& reason,
                        const std::vector<RankStacks>& stacks);

 private:
  struct Gather;
  HangReport StartReport(const HangAttempt& attempt, const std::vector<WorkerProgress>& progress);
  void Finish(const HangAttempt& attempt, HangReport report,
              std::chrono::system_clock::time_point when,
              std::chrono::steady_clock::time_point declared);
  std::string WriteStacks(int round, const std::vector<RankStacks>& stacks);
  const StackTools& Tools();

  boost::asio::io_context& io_;
  ChildRegistry& children_;
  HangResponderOptions options_;
  Targets targets_;
  AskRemote ask_remote_;
  IsCurrent is_current_;
  Concluded concluded_;
  std::optional<StackTools> tools_;
  bool gathering_ = false;
  std::vector<std::function<void(const std::vector<RankStacks>&)>> stack_waiters_;
};

// Tells, among ranks that fell silent together, the ones that hold the others up (by their
// stacks), and names on other nodes what every rank here waits for. Pure.
void JudgeHang(HangReport& report);

// PyTorch's NCCL flight recorder: asks each running rank (`ranks`) for its trace dump through
// the pipe crun's environment (the workers') names; returns notes for the report and adds the
// files to expect to *traces.
std::vector<std::string> TriggerFlightRecorder(const std::vector<int>& ranks,
                                               std::vector<std::string>* traces);

// Waits until each of `files` exists with a non-zero size unchanged for 0.5 s, or `wait` has
// passed; then `done` with a note naming what was (not) written.
void WaitForTraces(boost::asio::io_context& io, std::vector<std::string> files,
                   std::chrono::seconds wait, std::function<void(std::string)> done);

}  // namespace crun::agent
