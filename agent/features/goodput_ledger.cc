// The node's goodput ledger (docs/observability.md, "Goodput"): the agent's hooks and the
// job's progress, fed to the pure ledger (rendezvous/goodput/ledger.h) with the time each
// happened. At the job's end: the summary line, --goodput-file, and the metrics on every
// scrape before it. On for every job: it only listens.
#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "agent/features/job_feature.h"
#include "base/fd_writer.h"
#include "base/files.h"
#include "rendezvous/goodput/job_ledger.h"
#include "rendezvous/goodput/ledger_json.h"

namespace crun::agent {
namespace {

namespace gp = goodput;

// The kind of a report's root cause, for its incident row.
std::string KindOf(const report::WorkerFailure& f) {
  if (!f.hang.empty()) return "hang";
  if (!f.slow.empty()) return "slow";
  if (!f.oom.empty()) return "oom";
  if (report::WroteErrorFile(f) || !report::LastTracebackLine(f).empty()) return "exception";
  if (f.signal) return "signal";
  return "exit";
}

class GoodputLedger final : public JobFeature {
 public:
  explicit GoodputLedger(AgentView& agent)
      : agent_(agent),
        wall_at_start_(std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count()),
        steady_at_start_(std::chrono::steady_clock::now()),
        ledger_(gp::Ledger::Launched("", agent.options.host_name, agent.options.nproc, Wall())) {
    const int first = agent.options.first_local_rank;
    agent.progress.Listen({
        [this, first](int lr) { ledger_.Progress(Wall(), lr - first, std::nullopt); },
        [this, first](int lr, const StepRecord& r) {
          ledger_.Progress(Wall(), lr - first, r.step);
        },
        [this](std::optional<std::int64_t> step) { ledger_.Saved(Wall(), step); },
    });
  }

  Status Prepare() override {
    if (agent_.registry != nullptr) {
      agent_.registry->OnScrape([this] {
        agent_.meters->Goodput(ledger_.Settled().totals, gp::Goodput(ledger_.Live(Wall()).totals));
      });
    }
    return Status::Ok();
  }

  void OnJoinHeld() override { ledger_.GateHeld(Wall()); }
  void OnJoining() override { ledger_.Joining(Wall()); }
  void OnRound(std::chrono::steady_clock::duration) override {
    ledger_.Assigned(Wall(), agent_.group.spare, agent_.group.waited_for_nodes.count());
  }
  void OnAttemptStarted() override { ledger_.WorkersRunning(Wall()); }

  void OnFailureReported(const report::FailureReport& r) override {
    const gp::Ms now = Wall();
    if (r.failures.empty()) return ledger_.FailureKnown(now, now, "exit", report::Describe(r));
    const report::WorkerFailure& f = r.failures.front();
    const std::string kind = KindOf(f);
    gp::Ms fault = f.time_unix_ms > 0 ? f.time_unix_ms : now;
    if (kind == "hang") {
      // From its last progress; without one this attempt, from the attempt's start.
      fault = ledger_.LastProgress(f.local_rank - agent_.options.first_local_rank).value_or(0);
    }
    ledger_.FailureKnown(now, fault, kind, report::DescribeCause(r));
  }

  // The rendezvous stops the attempt (a peer failed, a node was lost, the job re-forms); after
  // a failure of this node's own, the same incident.
  void OnRestarting(const StopNotice& stop) override {
    const gp::Ms now = Wall();
    const std::string kind = !stop.kind.empty()    ? stop.kind
                             : stop.spends_restart ? "peer"
                                                   : "re-form";
    ledger_.FailureKnown(now, now - stop.fault_ago.count(), kind, stop.reason);
  }

  void OnFinish(int) override {
    ledger_.Finished(Wall());
    gp::NodeLedger node = ledger_.Settled();
    node.node = agent_.rendezvous.node_id();
    if (agent_.meters != nullptr) agent_.meters->Goodput(node.totals, gp::Goodput(node.totals));
    const gp::JobLedger job = gp::Combine({node});
    FdWriter::Stderr().Write("crun: " + gp::Summary(node) + " (this node)\n");
    if (!agent_.options.goodput_file.empty()) Write(job);
  }

 private:
  gp::Ms Wall() const {
    return wall_at_start_ + std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - steady_at_start_)
                                .count();
  }

  void Write(const gp::JobLedger& job) {
    const std::string& path = agent_.options.goodput_file;
    if (!ReplaceWholeFile(path, gp::FileJson(job).dump(2) + "\n")) {
      spdlog::warn("crun: --goodput-file {}: not written: {}", path, std::strerror(errno));
    }
  }

  AgentView& agent_;
  const gp::Ms wall_at_start_;  // the wall clock read once: a jump of it moves nothing
  const std::chrono::steady_clock::time_point steady_at_start_;
  gp::Ledger ledger_;
};

}  // namespace

std::unique_ptr<JobFeature> MakeGoodputLedger(AgentView& agent) {
  return std::make_unique<GoodputLedger>(agent);
}

}  // namespace crun::agent
