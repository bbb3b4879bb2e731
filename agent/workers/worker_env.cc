#include "agent/workers/worker_env.h"

#include <crun/worker/env_names.h>

namespace crun::agent {

Environment BuildWorkerEnvironment(const GroupAssignment& g, int local_rank,
                                   const std::string& error_file,
                                   const std::string& attempt_log_dir, const Environment& base) {
  Environment env = base;
  auto set = [&env](const char* name, const std::string& value) { env[name] = value; };
  auto num = [](int v) { return std::to_string(v); };
  set(env::kLocalRank, num(local_rank));
  set(env::kRank, num(g.base_rank + local_rank));
  set(env::kGroupRank, num(g.group_rank));
  set(env::kRoleRank, num(g.base_role_rank + local_rank));
  set(env::kRoleName, g.role);
  set(env::kLocalWorldSize, num(g.local_world_size));
  set(env::kWorldSize, num(g.world_size));
  set(env::kGroupWorldSize, num(g.group_world_size));
  set(env::kRoleWorldSize, num(g.role_world_size));
  set(env::kMasterAddr, g.master_addr);
  set(env::kMasterPort, std::to_string(g.master_port));
  set(env::kRestartCount, num(g.restart_count));
  set(env::kMaxRestarts, num(g.max_restarts));
  set(env::kRunId, g.run_id);
  // Workers are clients of the store crun hosts for this attempt.
  set(env::kUseAgentStore, "True");
  set(env::kErrorFile, error_file);
  // Async NCCL error handling defaults on, unless the user chose otherwise. Only the name
  // PyTorch 2.x reads, as torchrun 2.x does: 2.x warns on every rank when it sees the old
  // NCCL_ASYNC_ERROR_HANDLING, which is passed on only if the user set it (docs/environment.md).
  if (!base.contains(env::kNcclAsyncErrorHandling)) set(env::kNcclAsyncErrorHandling, "1");
  if (g.virtual_local_rank) {
    set(env::kLocalRank, "0");
    std::string device = num(local_rank);
    if (auto it = base.find(env::kCudaVisibleDevices); it != base.end() && !it->second.empty()) {
      std::vector<std::string> ids;
      std::size_t start = 0;
      for (auto comma = it->second.find(',');; comma = it->second.find(',', start)) {
        ids.push_back(it->second.substr(start, comma == std::string::npos ? std::string::npos
                                                                          : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      if (local_rank < static_cast<int>(ids.size()))
        device = ids[static_cast<std::size_t>(local_rank)];
    }
    set(env::kCudaVisibleDevices, device);
  }
  set(env::kCrunAttempt, num(g.restart_count));
  set(env::kCrunLogDir, attempt_log_dir);
  return env;
}

void AddHangChannels(const HangChannels& c, Environment& env) {
  if (c.heartbeat_fd >= 0) env[env::kCrunHeartbeatFd] = std::to_string(c.heartbeat_fd);
  if (c.stacks_fd >= 0) {
    env[env::kCrunStacksFd] = std::to_string(c.stacks_fd);
    env[env::kCrunStacksSafeSignal] = std::to_string(c.stacks_safe_signal);
    env[env::kCrunStacksSignal] = std::to_string(c.stacks_signal);
  }
  std::string first = c.python_dir;
  if (!c.python_sdk_dir.empty()) first += (first.empty() ? "" : ":") + c.python_sdk_dir;
  if (!first.empty()) {
    const auto it = env.find("PYTHONPATH");
    // Never a trailing ':' (an empty entry would put the working directory on the path).
    env["PYTHONPATH"] = first + (it == env.end() || it->second.empty() ? "" : ":" + it->second);
  }
  if (!c.timer_file.empty()) env[env::kTimerFile] = c.timer_file;
}

}  // namespace crun::agent
