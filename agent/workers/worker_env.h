// Builds each worker's environment: the one place where the contract of env_names.h is
// written (docs/environment.md). Pure: no I/O, the parent environment is passed in.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "agent/rendezvous/assignment.h"
#include "base/environment.h"

namespace crun::agent {

// `base` updated with the contract for `local_rank`; `error_file` may be empty (then
// TORCHELASTIC_ERROR_FILE is set empty, as torchrun does without a log directory).
Environment BuildWorkerEnvironment(const GroupAssignment& group, int local_rank,
                                   const std::string& error_file,
                                   const std::string& attempt_log_dir, const Environment& base);

// What crun gives a worker for hang detection and stack reading (docs/hangs.md); -1 or empty:
// not given.
struct HangChannels {
  int heartbeat_fd = -1;  // CRUN_HEARTBEAT_FD
  int stacks_fd = -1;     // CRUN_STACKS_FD, with CRUN_STACKS_SAFE_SIGNAL and CRUN_STACKS_SIGNAL
  int stacks_safe_signal = 0;
  int stacks_signal = 0;
  std::string python_dir;      // put first on PYTHONPATH (the hook's sitecustomize.py)
  std::string python_sdk_dir;  // next on PYTHONPATH (crun_worker.py)
  std::string timer_file;      // TORCHELASTIC_TIMER_FILE
};
void AddHangChannels(const HangChannels& channels, Environment& env);

}  // namespace crun::agent
