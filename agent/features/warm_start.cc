// --warm (docs/warm.md): Python workers are forked from a template process that has imported
// the modules asked for. The template starts with the job, before the first join, so that its
// imports overlap the rendezvous; the worker group forks from it once it is ready.
#include <filesystem>

#include "agent/features/job_feature.h"

namespace crun::agent {
namespace {

class WarmStart final : public JobFeature {
 public:
  explicit WarmStart(AgentView& agent) : agent_(agent) {}

  // The template gets the workers' interpreter and the environment every worker shares
  // (crun's, with the hook's directory on PYTHONPATH), so that what the imports read from it
  // (OMP_NUM_THREADS) is what a cold worker's would.
  Status Prepare() override {
    const AgentOptions& o = agent_.options;
    agent_.presence.WritePythonHook();
    Environment env = CurrentEnvironment();
    HangChannels hook;
    hook.python_dir = agent_.presence.python_dir();
    hook.python_sdk_dir = agent_.presence.python_sdk_dir();
    AddHangChannels(hook, env);
    const std::string dir = o.log_dir + "/warm";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    agent_.workers.StartWarm({o.command[0], o.command, o.warm_modules, dir, dir + "/template.log",
                              ToEnvp(env), o.nproc});
    return Status::Ok();
  }

 private:
  AgentView& agent_;
};

}  // namespace

std::unique_ptr<JobFeature> MakeWarmStart(AgentView& agent) {
  if (agent.options.warm_modules.empty()) return nullptr;
  return std::make_unique<WarmStart>(agent);
}

}  // namespace crun::agent
