// The rendezvous engine: applies the rules (rules.h) to the jobs of many run ids and turns
// their actions into messages for the agents' sessions. Single-threaded and clock-free: every
// event comes with the time it happened, and NextWake() says when OnTick is due, so tests
// drive it with invented times and the gRPC service (grpc_service.h) with the steady clock.
// It speaks plain C++ messages (messages.h); the gRPC adapter converts them to and from the wire.
//
// * Sessions are numbered by the caller; a session binds to one (run id, node id) when its
//   join is accepted. A second live session claiming a bound node id is refused, unless it
//   carries the same agent incarnation: then it is that agent back on a new session, and the
//   old session is let go as the node's loss before the join proceeds.
// * Each round gets a fresh worker store (hooks.start_store): MASTER_ADDR:MASTER_PORT in the
//   assignment. MASTER_ADDR is options.advertise_addr, or else the host the agent dialed to
//   reach this service (so a remote node never gets a loopback address).
// * A job whose agents have all gone after it ended is replaced by a new one on the next join
//   with its run id; up to options.keep_finished_jobs ended jobs stay visible to Status.
// * Stacks (docs/hangs.md): an agent whose worker hung (StacksWanted), or the Stacks call
//   (AskStacks), has the stacks of the running round's nodes read: each is sent a
//   StacksRequest, and their replies are gathered into one StacksResult, complete when every
//   node asked has answered, or at the asker's deadline with the silent ones listed as missing.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "proto/protocol_version.h"
#include "rendezvous/goodput/ledger.h"
#include "rendezvous/rules/rules.h"
#include "rendezvous/service/engine_metrics.h"
#include "rendezvous/service/job_status.h"
#include "rendezvous/service/messages.h"

namespace crun::rdzv {

using SessionId = std::uint64_t;

// A round's worker store; open until the handle is dropped.
class RoundStore {
 public:
  virtual ~RoundStore() = default;
  virtual std::uint16_t port() const = 0;
};

struct EngineHooks {
  // Queues one message on a session; never blocks. A closed session ignores it.
  std::function<void(SessionId, const msg::ServiceMessage&)> send;
  // A fresh worker store for (run id, round, its world size), for the round's members: each
  // one's IP addresses, those its agent connected from and those it declared (an empty entry
  // when none is known); rendezvous/store_server/round_store.h says whom that admits.
  std::function<StatusOr<std::unique_ptr<RoundStore>>(const std::string&, int, int,
                                                      const std::vector<std::vector<std::string>>&)>
      start_store;
  // What happened, one line per decision ("job7: round 2 formed: 3 nodes, 24 workers"). Optional.
  std::function<void(const std::string&)> log;
  // The answer to AskStacks(query); called once per accepted query.
  std::function<void(std::uint64_t query, const msg::StacksResult&)> stacks_done;
};

struct EngineOptions {
  std::string advertise_addr;  // empty: the host each agent dialed
  std::size_t keep_finished_jobs = 64;
  bool durable = false;  // told to agents in every assignment (RoundAssignment.durable_service)
  // Counted into when set (engine_metrics.h); outlives the engine.
  EngineMetrics* metrics = nullptr;
  // The job-wide slow-rank detector's thresholds (docs/health.md, "Slow ranks").
  StragglerSettings stragglers;
};

class Engine {
 public:
  Engine(EngineHooks hooks, EngineOptions options);
  ~Engine();

  // `peer_ip`: the address the session comes from (the gRPC layer knows it; "" if not).
  void OnMessage(SessionId session, const msg::AgentMessage& message, TimePoint now,
                 const std::string& peer_ip = "");
  // The session's stream ended (agent gone, or it left).
  void OnSessionClosed(SessionId session, TimePoint now);
  void OnTick(TimePoint now);
  // When OnTick is due next, if ever.
  std::optional<TimePoint> NextWake() const;

  msg::StatusResponse Status(const std::string& run_id, TimePoint now) const;
  // Reads the stacks of every node of `run_id`'s running round: hooks.stacks_done(query, ...)
  // within `timeout` (0: 15 s). An error (nothing asked) when the job is unknown or not running.
  crun::Status AskStacks(const std::string& run_id, std::uint64_t query, Millis timeout,
                         TimePoint now);
  // Answers that a StacksResult may carry in all (a gRPC message is at most 4 MiB); a node past
  // it is listed as missing.
  static constexpr std::size_t kMaxStacksBytes = std::size_t{3} << 20;
  std::size_t live_sessions() const { return bound_.size(); }
  // Sets what options.metrics shows of the engine's state (jobs by phase, agents, each job's
  // nodes and restarts); run before each scrape, on the engine's thread.
  void RefreshMetrics(TimePoint now) const;
  // The goodput ledgers of job `run_id` as of `now`, each node's carried on while it runs
  // (none: no such job, or no ledger came). An empty run id names the only job with ledgers,
  // and is set to it.
  std::vector<goodput::NodeLedger> Goodput(std::string& run_id, TimePoint now) const;

 private:
  struct Job;
  struct Binding {
    std::string run_id;
    std::string node_id;
  };
  struct StacksAsk {
    std::string run_id;
    std::optional<SessionId> requester;        // an agent (its own request id in result), or
    std::uint64_t query = 0;                   // the Stacks call's
    std::map<SessionId, std::string> waiting;  // session -> node id, not answered yet
    msg::StacksResult result;
    std::size_t bytes = 0;
    TimePoint deadline;
  };

  void OnJoin(SessionId session, const msg::Join& join, TimePoint now, const std::string& peer_ip);
  bool WellFormed(SessionId session, const msg::Join& join);
  void OnUnhealthy(SessionId session, const msg::Join& join, TimePoint now);
  void OnWorkersFailed(SessionId session, const msg::FailureReport& report, TimePoint now);
  void Apply(Job& job, Transition t, TimePoint now);
  // Slow ranks: a heartbeat's compute figures into the round's detector; its changes go to every
  // node of the job.
  void JudgeStragglers(Job& job, const std::string& node, const msg::Heartbeat& beat);
  // A round formed: its store, started (false: it could not be, and the job failed), logged
  // and counted.
  bool StartRound(Job& job, const FormRound& round, TimePoint now);
  // Each member's assignment, and each spare's notice.
  void SendAssignments(Job& job, const FormRound& round);
  // What a spare is told: it waits outside `round`.
  msg::Assignment SpareAssignment(int round, int restart_count) const;
  // exit_code not 0: the job's, over the root cause's (a crash loop's).
  void Finish(Job& job, bool success, const std::string& reason, int exit_code = 0);
  void SendToJob(const Job& job, const msg::ServiceMessage& m);
  // `code`: refused_total's reason (engine_metrics.h).
  void Refuse(SessionId session, const char* code, const std::string& reason);
  void Log(const std::string& line) const;
  void Unbind(SessionId session, TimePoint now, const std::string& cause = "its session ended");
  // Fans a stacks request out to the running round's nodes but `except`: the ask's id, or
  // kNotFound naming the run id when there is no such job or it is not running.
  crun::StatusOr<std::uint64_t> FanOutStacks(StacksAsk ask, const std::string& reason,
                                             std::optional<SessionId> except, Millis timeout,
                                             TimePoint now);
  void OnStacksReply(SessionId session, const msg::StacksReply& reply);
  void CompleteStacks(std::uint64_t id);
  Job& JobFor(const std::string& run_id, const Settings& settings, TimePoint now);
  void Forget(const std::string& run_id);
  void EvictFinished();

  EngineHooks hooks_;
  EngineOptions options_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  std::unordered_map<SessionId, Binding> bound_;
  std::uint64_t finish_sequence_ = 0;
  std::map<std::uint64_t, StacksAsk> asks_;  // by the service's request id
  std::uint64_t next_ask_ = 1;
};

}  // namespace crun::rdzv
