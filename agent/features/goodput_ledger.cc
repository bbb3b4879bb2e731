// The node's goodput ledger (docs/observability.md, "Goodput"): the agent's hooks and the
// job's progress, fed to the pure ledger (rendezvous/goodput/ledger.h) with the time each
// happened. The ledger goes to the rendezvous (which combines the job's) a second after each
// change of where the node's time goes, once a minute, and just before the node reports its
// workers' end. At the job's end: the summary line (the job's where the rendezvous combined
// it), --goodput-file, and the metrics on every scrape before it. On for every job: it only
// listens.
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "agent/features/job_feature.h"
#include "base/fd_writer.h"
#include "base/files.h"
#include "rendezvous/goodput/job_ledger.h"
#include "rendezvous/goodput/ledger_json.h"
#include "rendezvous/goodput/timeline.h"

namespace crun::agent {
namespace {

namespace gp = goodput;

constexpr auto kSettle = std::chrono::seconds(1);   // after a change, before it is shared
constexpr auto kRefresh = std::chrono::minutes(1);  // shared at least this often

// The kind of a report's root cause, for its incident row.
std::string KindOf(const report::WorkerFailure& f) {
  if (!f.hang.empty()) return "hang";
  if (!f.slow.empty()) return "slow";
  if (!f.oom.empty()) return "oom";
  if (report::WroteErrorFile(f) || !report::LastTracebackLine(f).empty()) return "exception";
  for (const std::string& line : f.stderr_tail) {
    if (line.find("Traceback (most recent call last)") != std::string::npos) return "exception";
  }
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
        ledger_(gp::Ledger::Launched("", agent.options.host_name, agent.options.nproc, Wall())),
        settle_(agent.io),
        refresh_(agent.io) {
    const int first = agent.options.first_local_rank;
    agent.progress.Listen({
        [this, first](int lr) {
          Heard([&] { ledger_.Progress(Wall(), lr - first, std::nullopt); });
        },
        [this, first](int lr, const StepRecord& r) {
          Heard([&] { ledger_.Progress(Wall(), lr - first, r.step); });
        },
        [this](std::optional<std::int64_t> step) { Heard([&] { ledger_.Saved(Wall(), step); }); },
    });
    // Live, at --metrics-port: this node's ledger as a timeline, and as JSON.
    agent.pages["/goodput"] = [this](const std::string&) {
      http::HttpResponse r;
      r.content_type = "text/html; charset=utf-8";
      r.body = gp::RenderTimeline(gp::Combine({Own(ledger_.Live(Wall()))}), Title());
      return r;
    };
    agent.pages["/goodput.json"] = [this](const std::string&) {
      http::HttpResponse r;
      r.content_type = "application/json";
      r.body = gp::FileJson(gp::Combine({Own(ledger_.Live(Wall()))})).dump(2) + "\n";
      return r;
    };
  }

  Status Prepare() override {
    if (agent_.registry != nullptr) {
      agent_.registry->OnScrape([this] {
        agent_.meters->Goodput(ledger_.Settled().totals, gp::Goodput(ledger_.Live(Wall()).totals));
      });
    }
    ArmRefresh();
    return Status::Ok();
  }

  void OnJoinHeld() override {
    Heard([&] { ledger_.GateHeld(Wall()); });
  }
  void OnJoining() override {
    Heard([&] { ledger_.Joining(Wall()); });
  }
  void OnRound(std::chrono::steady_clock::duration) override {
    Heard([&] {
      ledger_.Assigned(Wall(), agent_.group.spare, agent_.group.waited_for_nodes.count());
    });
  }
  void OnAttemptStarted() override {
    Heard([&] { ledger_.WorkersRunning(Wall()); });
  }

  void OnFailureReported(const report::FailureReport& r) override {
    const gp::Ms now = Wall();
    if (r.failures.empty()) {
      ledger_.FailureKnown(now, now, "exit", report::Describe(r));
    } else {
      const report::WorkerFailure& f = r.failures.front();
      const std::string kind = KindOf(f);
      gp::Ms fault = f.time_unix_ms > 0 ? f.time_unix_ms : now;
      if (kind == "hang") {
        // From its last progress; without one this attempt, from the attempt's start.
        fault = ledger_.LastProgress(f.local_rank - agent_.options.first_local_rank).value_or(0);
      }
      ledger_.FailureKnown(now, fault, kind, report::DescribeCause(r));
    }
    Share();  // before the report: the rendezvous has the ledger that explains it
  }

  void OnSucceeded() override { Share(); }

  // The rendezvous stops the attempt (a peer failed, a node was lost, the job re-forms); after
  // a failure of this node's own, the same incident.
  void OnRestarting(const StopNotice& stop) override {
    const gp::Ms now = Wall();
    const std::string kind = !stop.kind.empty()    ? stop.kind
                             : stop.spends_restart ? "peer"
                                                   : "re-form";
    Heard([&] { ledger_.FailureKnown(now, now - stop.fault_ago.count(), kind, stop.reason); });
  }

  void OnFinish(int) override {
    settle_.cancel();
    refresh_.cancel();
    ledger_.Finished(Wall());
    const gp::NodeLedger node = Own(ledger_.Settled());
    if (agent_.meters != nullptr) agent_.meters->Goodput(node.totals, gp::Goodput(node.totals));
    std::size_t job_nodes = 0;
    const gp::JobLedger job = JobOf(node, job_nodes);
    const bool job_wide = job_nodes > 1;
    FdWriter::Stderr().Write(
        "crun: " + (job_wide ? gp::Summary(job) : gp::Summary(node)) +
        (job_wide ? " (the job, " + std::to_string(job_nodes) + " nodes)\n" : " (this node)\n"));
    if (!agent_.options.goodput_file.empty()) Write(agent_.options.goodput_file, job);
    // In the log directory: the timeline to open in a browser, and the JSON it was drawn from;
    // where the job left something there already (logs, a failure report): a run that wrote
    // nothing leaves no directory behind (launcher/launch_command.cc).
    if (!HoldsAFile(agent_.options.log_dir)) return;
    Write(agent_.options.log_dir + "/goodput.json", job);
    // A job combined elsewhere comes without its segments (etcd): the timeline is this node's.
    WriteText(agent_.options.log_dir + "/goodput.html",
              gp::RenderTimeline(job.segments.empty() ? gp::Combine({node}) : job, Title()));
  }

 private:
  gp::Ms Wall() const {
    return wall_at_start_ + std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - steady_at_start_)
                                .count();
  }

  gp::NodeLedger Own(gp::NodeLedger l) const {
    l.node = agent_.rendezvous.node_id();
    return l;
  }

  // Feeds the ledger; a change of where the time goes is shared a moment later.
  template <typename Event>
  void Heard(const Event& event) {
    event();
    if (ledger_.Current() == shared_as_ || settling_) return;
    settling_ = true;
    settle_.expires_after(kSettle);
    settle_.async_wait([this](const boost::system::error_code& ec) {
      settling_ = false;
      if (!ec) Share();
    });
  }

  void Share() {
    shared_as_ = ledger_.Current();
    agent_.share_goodput(gp::ToJson(Own(ledger_.Live(Wall()))).dump());
  }

  void ArmRefresh() {
    refresh_.expires_after(kRefresh);
    refresh_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      Share();
      ArmRefresh();
    });
  }

  // The job's ledger, and of how many nodes: as the rendezvous combined it (etcd), with this
  // node's own; else combined here from the nodes' ledgers it handed over.
  gp::JobLedger JobOf(const gp::NodeLedger& own, std::size_t& nodes) const {
    const auto& outcome = agent_.outcome;
    if (!outcome.job_goodput.empty()) {
      auto job = gp::JobFromJson(
          nlohmann::json::parse(outcome.job_goodput, nullptr, /*allow_exceptions=*/false));
      if (job.ok()) {
        nodes = outcome.job_nodes;
        job->nodes = {own};
        return std::move(job).value();
      }
      spdlog::warn("crun: the job's goodput ledger from the rendezvous is left out: {}",
                   job.status().message());
    }
    gp::JobLedger job = gp::Combine(JobNodes(own));
    nodes = job.nodes.size();
    return job;
  }

  // The job's nodes as the rendezvous last had them, this node's own replaced by its final
  // ledger; this node alone where the rendezvous combines none.
  std::vector<gp::NodeLedger> JobNodes(const gp::NodeLedger& own) const {
    std::vector<gp::NodeLedger> nodes{own};
    for (const std::string& text : agent_.outcome.goodput) {
      auto n = gp::NodeFromText(text);
      if (!n.ok()) {
        spdlog::warn("crun: a node's goodput ledger from the rendezvous is left out: {}",
                     n.status().message());
        continue;
      }
      if (n->node != own.node) nodes.push_back(std::move(n).value());
    }
    return nodes;
  }

  // Whether the job left a file in `dir` that stays: crun's own while it runs (its pid file,
  // the Python hook and module, observe/run_presence.h) go with it.
  static bool HoldsAFile(const std::string& dir) {
    if (dir.empty()) return false;
    std::error_code ec;
    for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
         it.increment(ec)) {
      const auto name = it->path().filename().string();
      if (it.depth() == 0 && (name == "python" || name == "python-sdk" || name == "crun.pid")) {
        it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file(ec)) return true;
    }
    return false;
  }

  std::string Title() const {
    return agent_.group.run_id.empty() ? agent_.options.host_name
                                       : agent_.group.run_id + " on " + agent_.options.host_name;
  }

  void Write(const std::string& path, const gp::JobLedger& job) {
    WriteText(path, gp::FileJson(job).dump(2) + "\n");
  }

  void WriteText(const std::string& path, const std::string& text) {
    if (!ReplaceWholeFile(path, text)) {
      spdlog::warn("crun: {}: not written: {}", path, std::strerror(errno));
    }
  }

  AgentView& agent_;
  const gp::Ms wall_at_start_;  // the wall clock read once: a jump of it moves nothing
  const std::chrono::steady_clock::time_point steady_at_start_;
  gp::Ledger ledger_;
  boost::asio::steady_timer settle_, refresh_;
  bool settling_ = false;
  gp::Category shared_as_ = gp::Category::kStarting;
};

}  // namespace

std::unique_ptr<JobFeature> MakeGoodputLedger(AgentView& agent) {
  return std::make_unique<GoodputLedger>(agent);
}

}  // namespace crun::agent
