// The engine's parts (engine.h) shared by the files that hold its handlers: engine.cc (the
// messages, sessions, rounds and status), engine_joins.cc (joins) and engine_stacks.cc (`crun
// stacks` across a job's nodes). Private to them.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "rendezvous/service/engine.h"
#include "rendezvous/service/job_goodput.h"

namespace crun::rdzv {

struct Engine::Job {
  std::string run_id;
  State state;
  std::optional<TimePoint> wake;
  std::unordered_map<std::string, SessionId> sessions;          // node id -> its live session
  std::unordered_map<std::string, std::uint64_t> incarnations;  // node id -> its agent's
  std::unordered_map<std::string, std::string> dialed;          // node id -> host it dialed
  // node id -> the addresses its workers may reach the store from (its session's, declared)
  std::unordered_map<std::string, std::vector<std::string>> addresses;
  std::unordered_map<std::string, msg::NodeSnapshots> snapshots;  // node id -> last heartbeat's
  int world_size = 0;
  // Slow ranks in the running round (docs/health.md): the detector, who runs each rank (each
  // member's first RANK and node id, in rank order, from the round's assignments) and the ranks
  // named now (node id -> its named ranks).
  StragglerState stragglers;
  RankOwners rank_owners;
  std::unordered_map<std::string, std::vector<StragglerChange>> slow;
  std::unique_ptr<RoundStore> store;
  std::optional<msg::FailureReport> root_cause;  // the failure that ended the job or its round
  std::string last_failure;
  std::uint64_t finished = 0;       // 0 while running; else its order of finishing
  TimePoint gathering_since;        // for the round formation time
  EngineMetrics::JobSeries series;  // when the engine counts metrics
  JobGoodput goodput;               // its nodes' ledgers (docs/observability.md)
  // The nodes whose ledgers run on: a session open, the job not ended.
  std::set<std::string> LiveLedgers() const {
    std::set<std::string> live;
    if (finished == 0) {
      for (const auto& [node, session] : sessions) live.insert(node);
    }
    return live;
  }
};

inline bool Ended(Phase p) { return p == Phase::kFailed || p == Phase::kSucceeded; }

}  // namespace crun::rdzv
