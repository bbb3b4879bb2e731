// Telling a worker the kernel's OOM killer took from any other SIGKILL (supervise/oom.h,
// docs/hangs.md): the witnesses are opened once workers have run, off the path to starting
// them, and asked about each worker that died of SIGKILL; the report then says so.
#include <signal.h>

#include <boost/asio/post.hpp>

#include "agent/features/job_feature.h"
#include "agent/supervise/oom.h"

namespace crun::agent {
namespace {

class OomWitness final : public JobFeature {
 public:
  explicit OomWitness(AgentView& agent) : agent_(agent) {}

  void OnAttemptStarted() override {
    boost::asio::post(agent_.io, [this] {
      if (!watch_) watch_ = std::make_unique<OomWatch>(agent_.workers.cgroup_dir());
    });
  }

  std::string KillerOf(const Worker& w, const ExitStatus& exit) override {
    if (!watch_ || !exit.signaled || exit.value != SIGKILL) return "";
    const auto kill = watch_->Check(w.pid);
    return kill ? kill->Describe() : "";
  }

 private:
  AgentView& agent_;
  std::unique_ptr<OomWatch> watch_;
};

}  // namespace

std::unique_ptr<JobFeature> MakeOomWitness(AgentView& agent) {
  return std::make_unique<OomWitness>(agent);
}

}  // namespace crun::agent
