// torchelastic's events, as `--event-log-handler console` prints them: one JSON line on stderr
// each, {"name", "source", "timestamp" (ms since the epoch), "metadata"}, the metadata naming
// the run, role, host, group rank and restart count.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "agent/rendezvous/assignment.h"
#include "agent/workers/attempt_start.h"

namespace crun::agent {

class TorchelasticEvents {
 public:
  explicit TorchelasticEvents(std::string host) : host_(std::move(host)) {}

  // Event `name` from `source` ("AGENT", "WORKER") of the attempt of `group`.
  void Emit(const std::string& name, const char* source, nlohmann::json metadata,
            const GroupAssignment& group) const;
  // torchelastic.worker.status.<state> of worker `w`.
  void WorkerStatus(const Worker& w, const char* state, const GroupAssignment& group) const;

 private:
  std::string host_;
};

}  // namespace crun::agent
