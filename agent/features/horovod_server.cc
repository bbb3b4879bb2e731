// --contract horovod, or any contract whose descriptor has a round server (rendezvous/contracts/
// contracts.cc; docs/frameworks.md): group rank 0 (with one crun per Slurm task, its
// local rank 0's) serves the round's HTTP rendezvous (frameworks/horovod_kv.h), fresh for every
// round, on the port it reserved at its join; only the round's nodes may connect where their
// addresses are known. The server ends with the round's workers.
#include <spdlog/spdlog.h>

#include "agent/features/job_feature.h"
#include "agent/frameworks/horovod_kv.h"
#include "base/host_addresses.h"
#include "base/security.h"

namespace crun::agent {
namespace {

class HorovodServer final : public JobFeature {
 public:
  HorovodServer(AgentView& agent, Contract served) : agent_(agent), served_(served) {}

  void BeforeStart(AttemptStartContext&) override {
    server_.reset();
    kv_.reset();
    const GroupAssignment& group = agent_.group;
    if (group.group_rank != 0 || group.members.empty()) return;
    http::HttpServerOptions o;
    o.name = "Horovod's rendezvous";
    const auto port = PortLayout(agent_.options.contracts, agent_.options.nproc).Port(served_);
    o.bound_fd = agent_.reserved_ports.Take(*port).release();
    if (o.bound_fd < 0) return;  // none reserved: the workers' start says so
    o.max_connections = static_cast<std::size_t>(group.world_size) * 2 + 16;
    o.io_timeout = std::chrono::seconds(30);
    o.body_limit = 1 << 20;
    o.allowed_peers = AllowList(group);
    kv_ = std::make_unique<HorovodKv>(HorovodKv::ScopeSizes(group), HorovodKv::Limits{});
    auto served =
        http::HttpServer::Serve(agent_.io, o, [kv = kv_.get()](const http::HttpRequest& r) {
          return kv->Handle(r);
        });
    if (!served.ok()) {  // the workers' hvd.init() then fails, naming the address
      spdlog::error("cannot serve Horovod's rendezvous: {}", served.status().message());
      return;
    }
    server_ = std::move(served).value();
    spdlog::info("Horovod's rendezvous for round {} on port {}", group.round, server_->port());
  }

  void OnAttemptEnded() override { Stop(); }
  void OnFinish(int) override { Stop(); }

 private:
  // The round's nodes, by the addresses they gave (a name gives none), and loopback.
  static std::vector<std::string> AllowList(const GroupAssignment& group) {
    std::vector<std::vector<std::string>> members;
    for (const auto& m : group.members) {
      members.push_back(IsIpLiteral(m.address) ? std::vector<std::string>{m.address}
                                               : std::vector<std::string>{});
    }
    return RoundAllowList(members, /*with_loopback=*/true);
  }

  void Stop() {
    if (server_) server_->Stop();
  }

  AgentView& agent_;
  Contract served_;  // the contract whose port it serves on
  std::unique_ptr<HorovodKv> kv_;
  std::unique_ptr<http::HttpServer> server_;
};

}  // namespace

std::unique_ptr<JobFeature> MakeHorovodServer(AgentView& agent) {
  const AgentOptions& o = agent.options;
  if (o.first_local_rank != 0) return nullptr;
  for (Contract c : o.contracts.contracts()) {
    if (crun::SpecOf(c).round_server) return std::make_unique<HorovodServer>(agent, c);
  }
  return nullptr;
}

}  // namespace crun::agent
