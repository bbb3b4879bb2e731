#include "launcher/local_rendezvous.h"

#include "rendezvous/server/store_server.h"

namespace crun::launcher {

using agent::GroupAssignment;
using agent::Rendezvous;
namespace {

class LocalRendezvous final : public Rendezvous {
 public:
  LocalRendezvous(boost::asio::io_context& io, LocalRendezvousOptions options)
      : io_(io), options_(std::move(options)) {}
  ~LocalRendezvous() override { Shutdown(); }

  StatusOr<GroupAssignment> NextRound(int attempt) override {
    Shutdown();
    StoreServerOptions store;
    store.host = options_.store_host;
    store.port = options_.store_port;
    auto server = StoreServer::Start(io_, store);
    if (!server.ok()) return server.status();
    store_ = std::move(server).value();
    GroupAssignment g;
    g.run_id = options_.run_id;
    g.role = options_.role;
    g.local_world_size = options_.nproc;
    g.world_size = options_.nproc;
    g.role_world_size = options_.nproc;
    g.master_addr = options_.store_host;
    g.master_port = store_->port();
    g.restart_count = attempt;
    g.max_restarts = options_.max_restarts;
    g.virtual_local_rank = options_.virtual_local_rank;
    return g;
  }

  void Shutdown() override {
    if (store_) store_->Stop();
    store_.reset();
  }

 private:
  boost::asio::io_context& io_;
  LocalRendezvousOptions options_;
  std::unique_ptr<StoreServer> store_;
};

}  // namespace

std::unique_ptr<Rendezvous> MakeLocalRendezvous(boost::asio::io_context& io,
                                                const LocalRendezvousOptions& options) {
  return std::make_unique<LocalRendezvous>(io, options);
}

}  // namespace crun::launcher
