#include "rendezvous/service/engine_metrics.h"

namespace crun::rdzv {
namespace {

constexpr const char* kCauses[] = {kCauseExitCode, kCauseSignal,   kCauseOom,      kCauseHang,
                                   kCauseSlow,     kCauseNodeLost, kCauseHeartbeat};
constexpr const char* kReasons[] = {kRefusedNoToken, kRefusedWrongToken, kRefusedVersion,
                                    kRefusedBadJoin, kRefusedMismatch,   kRefusedDuplicate,
                                    kRefusedEnded,   kRefusedMalformed};

// Seconds from a gathering's start to its round: a millisecond (every node at once) to the
// join timeout (10 minutes by default).
std::vector<double> FormationBuckets() {
  auto b = metrics::LatencyBuckets();
  b.insert(b.end(), {120, 300, 600});
  return b;
}

}  // namespace

const char* FailureCause(const msg::FailureReport& report) {
  if (report.failures.empty()) return kCauseExitCode;
  const auto& f = report.failures.front();
  if (!f.hang.empty()) return kCauseHang;
  if (!f.slow.empty()) return kCauseSlow;
  if (!f.oom.empty()) return kCauseOom;
  if (f.signal) return kCauseSignal;
  return kCauseExitCode;
}

EngineMetrics::EngineMetrics(metrics::Registry& r)
    : jobs(r.AddGauge("crun_rendezvous_jobs",
                      "Jobs the daemon holds, by phase (gathering, running; succeeded and "
                      "failed ones are kept for crun status until evicted)",
                      {"phase"})),
      agents(
          r.AddGauge("crun_rendezvous_agents_connected", "Agents whose session is bound to a job")),
      sessions(r.AddGauge("crun_rendezvous_grpc_sessions",
                          "gRPC Session streams open (bound to a job or not)")),
      sessions_total(r.AddCounter("crun_rendezvous_grpc_sessions_total",
                                  "gRPC Session streams opened (refused ones too)")),
      finished_(r.AddCounter("crun_rendezvous_jobs_finished_total",
                             "Jobs that ended, by outcome (succeeded, failed)", {"outcome"})),
      refused_(r.AddCounter(
          "crun_rendezvous_refused_total",
          "Calls and joins refused, by reason: token_missing, token_wrong, protocol_version, "
          "bad_join (no run or node id, invalid settings), settings_mismatch, duplicate_node, "
          "job_ended, malformed (a Session message that does not parse)",
          {"reason"})),
      heartbeats_(r.AddCounter("crun_rendezvous_heartbeats_total",
                               "Heartbeats received from the job's agents", {"run_id"},
                               kJobSeries)),
      rounds_(
          r.AddCounter("crun_rendezvous_rounds_total", "Rounds formed", {"run_id"}, kJobSeries)),
      formation_(r.AddHistogram("crun_rendezvous_round_formation_seconds",
                                "Time from the start of a gathering (a job's first join, or "
                                "the stop of its previous round) to the round formed",
                                {}, FormationBuckets())),
      failures_(r.AddCounter("crun_rendezvous_failures_total",
                             "Failures that stopped a round or ended the job, by cause: "
                             "exit_code, signal, oom, hang (a worker's), node_lost (its agent's "
                             "session ended), heartbeat_timeout (its agent went silent)",
                             {"run_id", "cause"}, kJobSeries)),
      restarts_(r.AddCounter("crun_rendezvous_restarts_total",
                             "Restarts the job spent on failures (of --max-restarts)", {"run_id"},
                             kJobSeries)),
      unhealthy_(r.AddCounter("crun_rendezvous_unhealthy_nodes_total",
                              "Nodes that failed their health check before a join and stayed "
                              "out of the job (--health-check)",
                              {"run_id"}, kJobSeries)),
      stragglers_(r.AddCounter("crun_rendezvous_stragglers_total",
                               "Ranks the job-wide detector named slow: their compute time per "
                               "step above the other ranks' median (--straggler-action)",
                               {"run_id"}, kJobSeries)),
      nodes_(r.AddGauge("crun_rendezvous_job_nodes",
                        "The job's nodes, by state: member (of the running round), spare, "
                        "joined (gathering)",
                        {"run_id", "state"}, kJobSeries)),
      world_size_(r.AddGauge("crun_rendezvous_job_world_size", "Workers in the job's last round",
                             {"run_id"}, kJobSeries)),
      goodput_seconds_(r.AddGauge("crun_rendezvous_job_goodput_seconds",
                                  "The job's wall time by where it went, combined from its "
                                  "nodes' ledgers as of the scrape: training, redone, starting, "
                                  "detecting, restarting, reloading, waiting",
                                  {"run_id", "category"}, kJobSeries * goodput::kCategories)),
      goodput_ratio_(r.AddGauge("crun_rendezvous_job_goodput_ratio",
                                "The job's goodput: time every node trained new steps over wall "
                                "time (absent while its workers report no progress)",
                                {"run_id"}, kJobSeries)) {
  for (const char* reason : kReasons) refused_.With({reason});
  finished_.With({"succeeded"});
  finished_.With({"failed"});
}

EngineMetrics::JobSeries EngineMetrics::ForJob(const std::string& run_id) {
  JobSeries s;
  s.heartbeats = &heartbeats_.With({run_id});
  s.rounds = &rounds_.With({run_id});
  s.restarts = &restarts_.With({run_id});
  s.members = &nodes_.With({run_id, "member"});
  s.spares = &nodes_.With({run_id, "spare"});
  s.joined = &nodes_.With({run_id, "joined"});
  s.world_size = &world_size_.With({run_id});
  unhealthy_.With({run_id});                                          // shown from 0
  stragglers_.With({run_id});                                         // shown from 0
  for (const char* cause : kCauses) failures_.With({run_id, cause});  // shown from 0
  return s;
}

void EngineMetrics::Forget(const std::string& run_id) {
  heartbeats_.RemoveWhere(0, run_id);
  rounds_.RemoveWhere(0, run_id);
  restarts_.RemoveWhere(0, run_id);
  nodes_.RemoveWhere(0, run_id);
  world_size_.RemoveWhere(0, run_id);
  failures_.RemoveWhere(0, run_id);
  unhealthy_.RemoveWhere(0, run_id);
  stragglers_.RemoveWhere(0, run_id);
  goodput_seconds_.RemoveWhere(0, run_id);
  goodput_ratio_.RemoveWhere(0, run_id);
}

void EngineMetrics::Goodput(const std::string& run_id, const goodput::Totals& totals, bool known) {
  for (goodput::Category c : goodput::kAllCategories) {
    goodput_seconds_.With({run_id, std::string(goodput::NameOf(c))})
        .Set(static_cast<double>(goodput::At(totals, c)) / 1000.0);
  }
  if (known) goodput_ratio_.With({run_id}).Set(goodput::Goodput(totals));
}

void EngineMetrics::Unhealthy(const std::string& run_id) { unhealthy_.With({run_id}).Inc(); }

void EngineMetrics::StragglerNamed(const std::string& run_id) { stragglers_.With({run_id}).Inc(); }

void EngineMetrics::RoundFormed(JobSeries& job, double seconds_gathering) {
  job.rounds->Inc();
  formation_.With().Observe(seconds_gathering);
}

void EngineMetrics::Failure(const std::string& run_id, std::string_view cause) {
  failures_.With({run_id, std::string(cause)}).Inc();
}

void EngineMetrics::Refused(std::string_view reason) { refused_.With({std::string(reason)}).Inc(); }

void EngineMetrics::Finished(bool success) {
  finished_.With({success ? "succeeded" : "failed"}).Inc();
}

}  // namespace crun::rdzv
