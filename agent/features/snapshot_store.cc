// The node's snapshot store (docs/checkpoints.md): memory that crun holds for the whole job,
// where workers save their training state and load it back after a restart. Prepared before
// the first join, so that the first workers find it; every worker gets its socket in
// CRUN_SNAPSHOT_SOCKET. The memory goes when the job ends.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <crun/worker/env_names.h>
#include <spdlog/spdlog.h>

#include "agent/features/job_feature.h"
#include "agent/snapshots/snapshot_server.h"

namespace crun::agent {
namespace {

class SnapshotStore final : public JobFeature {
 public:
  explicit SnapshotStore(AgentView& agent)
      : agent_(agent), memory_(SnapshotMemoryOptions{agent.options.snapshot_memory, ""}) {}

  // A --snapshot-memory that cannot hold unnamed files is refused now, before any worker runs.
  Status Prepare() override {
    const std::string& dir = agent_.options.snapshot_memory;
    const int probe = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (probe < 0) {
      return PosixError("--snapshot-memory " + dir +
                            ": crun cannot keep snapshots there (a tmpfs directory is needed; "
                            "--snapshots off turns the store off)",
                        errno, StatusCode::kInvalidArgument);
    }
    ::close(probe);
    if (!agent_.options.snapshot_disk.dir.empty()) {
      disk_ = std::make_unique<DiskSnapshots>(agent_.options.snapshot_disk);
      CRUN_RETURN_IF_ERROR(disk_->Prepare());
    }
    if (agent_.options.snapshot_replicas) {
      std::shared_ptr<PeerTls> tls;
      const Security& job = agent_.options.snapshot_security;
      if (job.tls()) {
        auto made = PeerTls::Make(job);
        if (!made.ok()) return made.status();
        tls = std::move(made).value();
        spdlog::info("snapshot copies travel over TLS 1.3, {}",
                     tls->verifies() ? "each node's certificate checked against --tls-ca"
                     : job.token.empty()
                         ? "but nothing proves a peer: give the job a token (--token-file) "
                           "or each node a certificate"
                         : "peers proven by the job's token, bound to each session");
      }
      auto replicas = Replicas::Listen(job.token, std::move(tls));
      if (!replicas.ok()) return replicas.status();
      replicas_ = std::move(replicas).value();
    }
    auto server = SnapshotServer::Listen(agent_.io, memory_, disk_.get(), replicas_.get());
    if (!server.ok()) return server.status();
    server_ = std::move(server).value();
    server_->OnChange([this] {
      // A snapshot saved is a step done (crash loops, docs/health.md).
      const std::uint64_t saves = server_->counters().saves;
      if (saves > saves_seen_) {
        const auto step = memory_.NodeStep();
        agent_.progress.Saved(saves - saves_seen_,
                              step ? std::optional<std::int64_t>(static_cast<std::int64_t>(*step))
                                   : std::nullopt);
      }
      saves_seen_ = saves;
      ReportFacts();
      Mirror();
    });
    return Status::Ok();
  }

  // For the heartbeats (`crun status`).
  void ReportFacts() {
    SnapshotFacts& f = *agent_.options.snapshot_facts;
    f.bytes = memory_.allocated_bytes();
    const auto step = memory_.NodeStep();
    f.step = step ? static_cast<std::int64_t>(*step) : -1;
    const DiskCounters d = disk_ ? disk_->counters() : DiskCounters{};
    f.disk_step = d.written > 0 ? static_cast<std::int64_t>(d.last_step) : -1;
  }

  void Mirror() {
    AgentMetrics* m = agent_.meters;
    if (m == nullptr) return;
    const SnapshotCounters& c = server_->counters();
    m->snapshot_bytes->Set(static_cast<double>(memory_.allocated_bytes()));
    m->snapshot_saves->Mirror(static_cast<double>(c.saves));
    m->snapshot_loads->Mirror(static_cast<double>(c.loads));
    m->snapshot_refusals->Mirror(static_cast<double>(c.refusals));
    m->snapshot_corrupt->Mirror(static_cast<double>(c.corrupt));
    if (replicas_) {
      const ReplicaCounters r = replicas_->counters();
      m->snapshot_replicas_sent->Mirror(static_cast<double>(r.sent));
      m->snapshot_replica_failures->Mirror(static_cast<double>(r.send_failures));
      m->snapshot_replicas_received->Mirror(static_cast<double>(r.received));
      m->snapshot_replica_refusals->Mirror(static_cast<double>(r.refused));
      m->snapshot_replica_bytes->Set(static_cast<double>(r.held_bytes));
    }
    if (!disk_) return;
    const DiskCounters d = disk_->counters();
    m->snapshot_disk_writes->Mirror(static_cast<double>(d.written));
    m->snapshot_disk_skipped->Mirror(static_cast<double>(d.skipped));
    m->snapshot_disk_failures->Mirror(static_cast<double>(d.failed));
    m->snapshot_disk_restores->Mirror(static_cast<double>(d.restored));
    m->snapshot_disk_step->Set(static_cast<double>(d.last_step));
  }

  void BeforeStart(AttemptStartContext& c) override {
    c.base[env::kCrunSnapshotSocket] = SnapshotSocketName(::getpid());
    const GroupAssignment& g = c.group;
    if (disk_) {
      round_ = {g.group_rank,       g.group_world_size, g.base_rank,
                g.local_world_size, g.master_addr,      g.master_port};
      disk_->NewRound(round_);
    }
    if (!replicas_) return;
    replicas_->NewRound(g.group_rank, g.group_world_size, g.master_addr, g.master_port);
    if (g.group_world_size > 1) {
      c.base[env::kCrunSnapshotCommit] = "1";
    } else {
      c.base.erase(env::kCrunSnapshotCommit);
    }
  }

  // The attempt's store goes with it: the disk writer stops asking it.
  void OnAttemptEnded() override {
    if (!disk_) return;
    round_.store_host.clear();
    disk_->NewRound(round_);
  }

  void OnFinish(int) override {
    server_.reset();
    replicas_.reset();
    memory_.Clear();
    *agent_.options.snapshot_facts = SnapshotFacts{};
  }

 private:
  AgentView& agent_;
  NodeSnapshots memory_;
  std::unique_ptr<DiskSnapshots> disk_;
  DiskRound round_;  // the last round, as told to disk_
  std::unique_ptr<Replicas> replicas_;
  std::unique_ptr<SnapshotServer> server_;  // after memory_, disk_ and replicas_: goes first
  std::uint64_t saves_seen_ = 0;            // told to the job's progress
};

}  // namespace

std::unique_ptr<JobFeature> MakeSnapshotStore(AgentView& agent) {
  if (!agent.options.snapshots) return nullptr;
  return std::make_unique<SnapshotStore>(agent);
}

}  // namespace crun::agent
