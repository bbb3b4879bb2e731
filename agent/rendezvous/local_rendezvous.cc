#include "agent/rendezvous/local_rendezvous.h"

#include <thread>

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include "base/endpoint.h"
#include "rendezvous/server/store_server.h"
#include "rendezvous/store/tcp_store_client.h"

namespace crun::agent {
namespace {

class LocalRendezvous final : public Rendezvous {
 public:
  LocalRendezvous(boost::asio::io_context& io, LocalRendezvousOptions options)
      : io_(io), options_(std::move(options)) {}
  ~LocalRendezvous() override {
    StopStore();
    if (done_thread_.joinable()) done_thread_.join();
  }

  void Start(RendezvousEvents* events) override { events_ = events; }

  // Every round is a restart: its store is new, so a restarted worker never reads a key of
  // an earlier attempt.
  void Join(const std::vector<std::uint16_t>& ports) override {
    if (!options_.static_store) StopStore();
    if (options_.host_store && !store_) {
      StoreServerOptions store;
      store.host = BindHost();
      store.port = options_.store_port;
      // Every worker of the job connects: this node's, and with the static backend every
      // node's (or every Slurm task's).
      store.expected_connections = static_cast<std::size_t>(
          options_.fixed_group ? std::max(options_.fixed_group->world_size, 1)
                               : options_.nproc * std::max(options_.nnodes, 1));
      auto server = StoreServer::Start(io_, store);
      if (!server.ok()) {
        JobOutcome o;
        o.exit_code = 1;
        o.reason = "cannot start the worker store: " + server.status().message();
        return Post([this, o] { events_->OnFinished(o); });
      }
      store_ = std::move(server).value();
    }
    GroupAssignment g;
    g.run_id = options_.run_id;
    g.role = options_.role;
    g.group_rank = options_.node_rank;
    g.group_world_size = options_.nnodes;
    g.local_world_size = options_.nproc;
    g.world_size = options_.nproc * options_.nnodes;
    g.role_world_size = g.world_size;
    g.base_rank = options_.node_rank * options_.nproc;
    g.base_role_rank = g.base_rank;
    g.master_addr = options_.store_host;
    g.master_port = store_ ? store_->port() : options_.store_port;
    g.restart_count = restarts_;
    g.round = restarts_;
    g.max_restarts = options_.max_restarts;
    g.virtual_local_rank = options_.virtual_local_rank;
    if (options_.fixed_group) {
      const GroupAssignment& f = *options_.fixed_group;
      g.group_rank = f.group_rank;
      g.group_world_size = f.group_world_size;
      g.local_world_size = f.local_world_size;
      g.world_size = f.world_size;
      g.role_world_size = f.world_size;
      g.base_rank = f.base_rank;
      g.base_role_rank = f.base_rank;
    }
    // One node: it is the whole round. Static nodes and Slurm tasks exchange nothing.
    if (!options_.fixed_group && options_.nnodes <= 1) {
      g.members = {RoundMember{options_.host, options_.store_host, options_.nproc, ports}};
    }
    Post([this, g] { events_->OnAssignment(g); });
  }

  void ReportFailure(const std::vector<FailureRecord>& failures) override {
    const FailureRecord& root = failures.front();
    const std::string what = "rank " + std::to_string(root.rank) + " failed with " +
                             (root.hang.empty() ? root.exit.Describe() : "a hang: " + root.hang) +
                             (root.oom.empty() ? "" : " (" + root.oom + ")");
    if (restarts_ < options_.max_restarts) {
      ++restarts_;
      return Post([this, what] { events_->OnStopAndRejoin(what, true); });
    }
    JobOutcome o;
    o.exit_code = root.exit.ShellCode();
    o.reason = what;
    o.root_node_id = node_id();
    o.root_report = failures;
    Conclude(o);
  }

  void ReportSuccess() override {
    JobOutcome o;
    o.success = true;
    o.reason = "all workers succeeded";
    Conclude(o);
  }

  void Leave(const std::string&) override { StopStore(); }
  std::string node_id() const override { return "local"; }
  // One node: nobody else to ask, and nobody asks.
  void AskStacks(const std::string&, std::chrono::milliseconds,
                 std::function<void(RemoteStacks)> done) override {
    Post([done = std::move(done)] { done({}); });
  }
  void ReplyStacks(std::uint64_t, const std::string&, const std::vector<RankStacks>&,
                   const std::string&) override {}

 private:
  template <typename F>
  void Post(F f) {
    boost::asio::post(io_, std::move(f));
  }
  // Where the hosted store listens (LocalRendezvousOptions::bind_host).
  const std::string& BindHost() const {
    return options_.bind_host.empty() ? options_.store_host : options_.bind_host;
  }
  void StopStore() {
    if (store_) store_->Stop();
    store_.reset();
  }

  // This crun's workers are done for good. Alone, that is the end; sharing a static store, it
  // first says so on the store, off the event loop (which serves the store when this crun
  // hosts it), and the host waits there for the others (LocalRendezvousOptions::store_linger).
  void Conclude(const JobOutcome& o) {
    const int participants =
        options_.fixed_group ? options_.fixed_group->world_size : options_.nnodes;
    if (!options_.static_store || participants <= 1 || done_thread_.joinable()) {
      return Post([this, o] { events_->OnFinished(o); });
    }
    const bool hosting = store_ != nullptr;
    TcpStoreClientOptions c;
    const std::string bound = BindHost();
    c.host = !hosting ? options_.store_host
                      : (bound == "::" || bound == "0.0.0.0" ? std::string("127.0.0.1") : bound);
    c.port = hosting ? store_->port() : options_.store_port;
    c.connect_timeout = std::chrono::seconds(5);
    c.timeout = std::chrono::seconds(5);
    done_thread_ = std::thread([this, o, c, hosting, participants] {
      SayDone(c, hosting, participants);
      Post([this, o] { events_->OnFinished(o); });
    });
  }

  void SayDone(const TcpStoreClientOptions& c, bool hosting, int participants) const {
    static constexpr char kDone[] = "/crun/done";
    static constexpr char kAllDone[] = "/crun/all-done";
    const std::string where = FormatEndpoint(c.host, c.port);
    auto client = TcpStoreClient::Connect(c);
    if (!client.ok()) {
      spdlog::info("not telling the store at {} that this crun is done: {}", where,
                   client.status().message());
      return;
    }
    auto n = (*client)->Add(kDone, 1);
    if (!n.ok()) {
      spdlog::info("not telling the store at {} that this crun is done: {}", where,
                   n.status().message());
      return;
    }
    if (*n >= participants) (void)(*client)->Set(kAllDone, "1");
    if (!hosting || *n >= participants) return;
    spdlog::info(
        "keeping the store up until the other {} crun processes are done (at most {} "
        "ms)",
        participants - *n, options_.store_linger.count());
    if (!(*client)->Wait({kAllDone}, options_.store_linger).ok()) {
      auto now = (*client)->Add(kDone, 0);
      spdlog::warn("stopping the store: {} of {} crun processes said they were done within {} ms",
                   now.ok() ? *now : *n, participants, options_.store_linger.count());
    }
  }

  boost::asio::io_context& io_;
  LocalRendezvousOptions options_;
  RendezvousEvents* events_ = nullptr;
  std::unique_ptr<StoreServer> store_;
  int restarts_ = 0;
  std::thread done_thread_;  // Conclude()'s word with the store
};

}  // namespace

std::unique_ptr<Rendezvous> MakeLocalRendezvous(boost::asio::io_context& io,
                                                const LocalRendezvousOptions& options) {
  return std::make_unique<LocalRendezvous>(io, options);
}

}  // namespace crun::agent
