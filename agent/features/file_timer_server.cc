// torchelastic's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1, docs/hangs.md): crun serves the
// pipe its workers' FileTimerClient writes to. A request is the worker's progress; a timer that
// expires makes that worker hung, as a silent one is (the hang watch decides the rest).
#include <spdlog/spdlog.h>

#include "agent/features/job_feature.h"
#include "agent/hangs/file_timer.h"

namespace crun::agent {
namespace {

class FileTimer final : public JobFeature {
 public:
  explicit FileTimer(AgentView& agent) : agent_(agent) {}

  // The server starts before any worker, which gets its pipe.
  Status Prepare() override {
    const AgentOptions& o = agent_.options;
    const std::string path = o.timer_file.empty() ? o.log_dir + "/timer.pipe" : o.timer_file;
    auto server = FileTimerServer::Open(
        agent_.io, path,
        [this](pid_t pid) {
          if (Worker* w = agent_.workers.OfPid(pid)) ++*w->progress;
        },
        [this](pid_t pid, std::string cause) { Expired(pid, std::move(cause)); });
    if (!server.ok()) return server.status();
    server_ = std::move(server).value();
    spdlog::info("torchelastic file timer: serving {}", server_->path());
    return Status::Ok();
  }

  void BeforeStart(AttemptStartContext& c) override { c.timer_file = server_->path(); }
  void OnAttemptEnded() override {
    if (server_) server_->Clear();
  }
  void OnFinish(int) override { server_.reset(); }

 private:
  void Expired(pid_t pid, std::string cause) {
    Worker* w = agent_.workers.OfPid(pid);
    if (w == nullptr) {
      spdlog::warn("file timer: {}, but pid {} is not (or no longer) one of this crun's workers",
                   cause, pid);
      return;
    }
    if (agent_.lifecycle.phase == lifecycle::Phase::kRunning) {
      agent_.hangs.watch().Expire(w->local_rank, std::move(cause));
    }
  }

  AgentView& agent_;
  std::unique_ptr<FileTimerServer> server_;
};

}  // namespace

std::unique_ptr<JobFeature> MakeFileTimer(AgentView& agent) {
  if (!agent.options.file_timer) return nullptr;
  return std::make_unique<FileTimer>(agent);
}

}  // namespace crun::agent
