// The control socket and crun.pid (observe/run_presence.h): once the first workers run, off
// the path to starting them, `crun stacks PID` and `crun stacks --log-dir` can reach this crun
// and get every running rank's stacks, read now, as JSON.
#include <unistd.h>

#include <boost/asio/post.hpp>

#include "agent/features/job_feature.h"
#include "agent/hangs/stack_summary.h"

namespace crun::agent {
namespace {

constexpr auto kReplace = nlohmann::json::error_handler_t::replace;

class ControlSocket final : public JobFeature {
 public:
  explicit ControlSocket(AgentView& agent) : agent_(agent) {}

  void OnAttemptStarted() override {
    boost::asio::post(agent_.io, [this] {
      agent_.presence.Announce(
          [this](const std::string& request, std::function<void(std::string)> reply) {
            Answer(request, std::move(reply));
          });
    });
  }

 private:
  void Answer(const std::string& request, std::function<void(std::string)> reply) {
    // A request or a stack may hold bytes that are not UTF-8 (a path, a worker's frame):
    // replaced, never a throw.
    auto text = [](const nlohmann::json& j) { return j.dump(-1, ' ', false, kReplace); };
    auto error = [&](const std::string& why) { reply(text(nlohmann::json{{"error", why}})); };
    if (request != "stacks") return error("unknown request '" + request + "'");
    const auto phase = agent_.lifecycle.phase;
    if (phase != lifecycle::Phase::kRunning) {
      return error(phase == lifecycle::Phase::kStopping
                       ? "the workers are being stopped"
                       : "no workers are running (waiting for the rendezvous)");
    }
    agent_.hangs.stacks().ReadStacks([this, reply, text](const std::vector<RankStacks>& stacks) {
      const GroupAssignment& g = agent_.group;
      nlohmann::json j{{"host", agent_.options.host_name},
                       {"run_id", g.run_id},
                       {"attempt", g.restart_count},
                       {"pid", ::getpid()},
                       {"world_size", g.world_size}};
      j["stacks"] = nlohmann::json::array();
      for (const auto& st : stacks) j["stacks"].push_back(StacksJson(st));
      reply(text(j));
    });
  }

  AgentView& agent_;
};

}  // namespace

std::unique_ptr<JobFeature> MakeControlSocket(AgentView& agent) {
  return std::make_unique<ControlSocket>(agent);
}

}  // namespace crun::agent
