#include "agent/observe/torchelastic_events.h"

#include <chrono>

#include "base/fd_writer.h"

namespace crun::agent {

void TorchelasticEvents::Emit(const std::string& name, const char* source, nlohmann::json metadata,
                              const GroupAssignment& group) const {
  metadata["run_id"] = group.run_id;
  metadata["role"] = group.role;
  metadata["hostname"] = host_;
  metadata["group_rank"] = group.group_rank;
  metadata["agent_restarts"] = group.restart_count;
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  nlohmann::json e{{"name", name},
                   {"source", source},
                   {"timestamp", now.count()},
                   {"metadata", std::move(metadata)}};
  // One line, never split by another writer's, through crun's stderr writer (a stalled reader
  // holds back none of the agent).
  // A worker's host or role name need not be UTF-8: replaced, never a throw.
  FdWriter::Stderr().Write(e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

void TorchelasticEvents::WorkerStatus(const Worker& w, const char* state,
                                      const GroupAssignment& group) const {
  nlohmann::json m{{"state", state},
                   {"global_rank", group.base_rank + w.local_rank},
                   {"local_rank", w.local_rank},
                   {"worker_id", std::to_string(w.pid)},
                   {"exit", w.exit.Describe()}};
  Emit(std::string("torchelastic.worker.status.") + state, "WORKER", std::move(m), group);
}

}  // namespace crun::agent
