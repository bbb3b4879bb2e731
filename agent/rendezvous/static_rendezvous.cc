#include "agent/rendezvous/static_rendezvous.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <utility>

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/member_exchange.h"
#include "base/endpoint.h"
#include "base/host_addresses.h"
#include "rendezvous/rules/rules.h"
#include "rendezvous/store/tcp_store_client.h"
#include "rendezvous/store_server/round_store.h"

namespace crun::agent {
namespace {

// Tells this crun's claim of a node rank from an earlier one's on the same host.
std::string RandomClaimId() {
  std::random_device rd;
  return std::to_string(rd()) + "-" + std::to_string(rd());
}

class StaticRendezvous final : public Rendezvous {
 public:
  StaticRendezvous(boost::asio::io_context& io, StaticRendezvousOptions options)
      : io_(io), options_(std::move(options)), store_(&io) {}
  ~StaticRendezvous() override {
    stop_exchange_ = true;
    if (exchange_thread_.joinable()) exchange_thread_.join();
    store_.Stop();
    if (done_thread_.joinable()) done_thread_.join();
  }

  void Start(RendezvousEvents* events) override { events_ = events; }

  // Every round is a restart: its store is new, so a restarted worker never reads a key of
  // an earlier attempt.
  void Join(const std::vector<std::uint16_t>& ports) override {
    ++joins_;
    if (options_.host_store) {
      RoundStoreSpec spec;
      spec.bind_host = BindHost();
      spec.port = options_.store_port;
      // Every worker of the job connects: this node's, and with the static backend every
      // node's (or every Slurm task's), whose addresses are not known here.
      spec.world_size = options_.fixed_group
                            ? options_.fixed_group->world_size
                            : options_.nproc * std::max(options_.settings.max_nodes, 1);
      auto port = store_.Serve(options_.static_store ? 0 : joins_, spec);
      if (!port.ok()) {
        JobOutcome o;
        o.exit_code = 1;
        o.reason = "cannot start the worker store: " + port.status().message();
        return Post([this, o] { events_->OnFinished(o); });
      }
    } else {
      store_.Stop();
    }
    // Its place: --node-rank of --nnodes, or a Slurm task's (fixed_group).
    RoundPlace place{.group_rank = options_.node_rank,
                     .group_world_size = options_.settings.max_nodes,
                     .world_size = options_.nproc * options_.settings.max_nodes,
                     .base_rank = options_.node_rank * options_.nproc,
                     .round = restarts_,
                     .restart_count = restarts_};
    if (const auto& f = options_.fixed_group) {
      place = *f;
      place.round = place.restart_count = restarts_;
    }
    GroupAssignment g =
        MakeGroupAssignment({options_.run_id, options_.role, "", options_.nproc,
                             options_.settings.max_restarts, options_.virtual_local_rank},
                            place);
    g.master_addr = options_.store_host;
    g.master_port = store_.serving() ? store_.port() : options_.store_port;
    // One node: it is the whole round. Static nodes and Slurm tasks exchange what the
    // contracts need over the shared store, off the event loop (which may serve that store).
    if (Participants() <= 1) {
      g.members = {RoundMember{options_.host, options_.store_host, options_.nproc, ports}};
    } else if (!ports.empty() || options_.wait_for_all) {
      return Exchange(std::move(g), ports);
    } else if (MustClaim()) {
      return ClaimThenAssign(std::move(g));
    }
    Post([this, g] { events_->OnAssignment(g); });
  }

  // Restarts are per node here, and so are crash loops: this node's own failures count.
  // Weighed by the rules the service runs (rdzv::OnFailure); the other crun processes of a
  // shared store weigh it too, told when this one begins the next round or ends the job.
  void ReportFailure(const report::FailureReport& failures) override {
    const rdzv::Failure failure = rdzv::FailureOf(failures);
    after_ = failure;
    if (auto fail = rdzv::OnFailure(restarts_, crash_loop_, failure, options_.settings)) {
      JobOutcome o;
      o.exit_code = rdzv::FailedJobExitCode(*fail, report::ExitCodeOf(failures));
      o.reason = fail->reason;
      o.root_node_id = node_id();
      o.root_report = failures;
      return Conclude(o);
    }
    Post([this, what = failure.what] {
      events_->OnStopAndRejoin({what, true, rdzv::kStopPeer, {}});
    });
  }

  void ReportSuccess() override {
    JobOutcome o;
    o.success = true;
    o.reason = "all workers succeeded";
    Conclude(o);
  }

  // Nobody keeps a static job's state: the other nodes wait for this one until their join
  // timeout, and its exit code tells the scheduler (docs/health.md).
  void ReportUnhealthy(const std::string&) override {}

  void Leave(const std::string&) override {
    stop_exchange_ = true;
    store_.Stop();
  }
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
  // Where the hosted store listens (StaticRendezvousOptions::bind_host).
  const std::string& BindHost() const {
    return options_.bind_host.empty() ? options_.store_host : options_.bind_host;
  }
  // The crun processes that share the static store: nodes, or Slurm tasks.
  int Participants() const {
    return options_.fixed_group ? options_.fixed_group->world_size : options_.settings.max_nodes;
  }
  // A client of the shared store: this crun's own through loopback when it hosts it.
  TcpStoreClientOptions StoreClient(std::chrono::milliseconds timeout) const {
    TcpStoreClientOptions c;
    const bool hosting = store_.serving();
    const std::string bound = BindHost();
    c.host = !hosting ? options_.store_host
                      : (bound == "::" || bound == "0.0.0.0" ? std::string("127.0.0.1") : bound);
    c.port = hosting ? store_.port() : options_.store_port;
    c.connect_timeout = timeout;
    c.timeout = timeout;
    return c;
  }

  // A node of a static job of several, before its first workers start: it claims its rank on
  // the job's store, so that two nodes given one rank (two pods with one index) do not both run
  // as it. Slurm's tasks have theirs from Slurm.
  bool MustClaim() const {
    return joins_ == 1 && options_.static_store && !options_.fixed_group && Participants() > 1;
  }

  // Claims this node's rank under /crun/node/<rank> on the store at the address every node
  // names (not loopback: a second node 0 hosts a store of its own, which would not know the
  // first). Another host's claim is an error naming both; this host's is an earlier crun of
  // it (a pod replaced keeps its host name), whose claim this one takes over.
  Status ClaimRank() {
    TcpStoreClientOptions c;
    c.host = options_.store_host;
    c.port = options_.store_port;
    c.connect_timeout = options_.settings.join_timeout;
    c.timeout = options_.settings.join_timeout;
    auto client =
        ConnectWhile(c, std::chrono::milliseconds(250), [this] { return !stop_exchange_; });
    if (!client.ok()) return client.status();
    const std::string key = "/crun/node/" + std::to_string(options_.node_rank);
    const std::string mine = options_.host + "\n" + claim_id_;
    auto held = (*client)->CompareSet(key, "", mine);
    if (!held.ok()) return held.status();
    if (*held == mine) return Status::Ok();
    const std::string holder = held->substr(0, held->find('\n'));
    if (holder != options_.host) {
      return InvalidArgument(rdzv::RankClaimedTwice(options_.node_rank, holder, options_.host));
    }
    spdlog::info("node rank {}: taking over the claim of an earlier crun on this host",
                 options_.node_rank);
    return (*client)->Set(key, mine);
  }

  // The first round of a node that must claim its rank: the claim, then the round, off the
  // event loop (which serves the store on node 0); a refused claim ends the job.
  void ClaimThenAssign(GroupAssignment g) {
    exchange_thread_ = std::thread([this, g = std::move(g)] {
      const Status claimed = ClaimRank();
      if (claimed.code() == StatusCode::kAborted) return;
      if (!claimed.ok()) {
        JobOutcome o;
        o.exit_code = 1;
        o.reason = claimed.message();
        return Post([this, o] { events_->OnFinished(o); });
      }
      Post([this, g] { events_->OnAssignment(g); });
    });
  }

  // Publishes this crun's address and reserved ports on the shared store and gives the round
  // once every participant has (member_exchange.h); an exchange that fails ends the job.
  void Exchange(GroupAssignment g, const std::vector<std::uint16_t>& ports) {
    Participant self;
    self.index = options_.fixed_group ? g.base_rank + options_.first_local_rank : g.group_rank;
    self.node = g.group_rank;
    self.local_rank = options_.fixed_group ? options_.first_local_rank : 0;
    self.nproc = options_.nproc;
    self.host = options_.host;
    self.address = options_.advertise_addr.empty()
                       ? LocalAddressToward(options_.store_host, options_.store_port)
                       : options_.advertise_addr;
    if (self.address.empty()) self.address = options_.host;
    self.ports = ports;
    ExchangeOptions e;
    e.round = g.round;
    e.participants = Participants();
    e.who = options_.fixed_group ? "Slurm task" : "node";
    e.timeout = options_.settings.join_timeout;
    e.contracts = options_.settings.contracts;
    e.stop = &stop_exchange_;
    e.after = std::exchange(after_, std::nullopt);
    self_index_ = self.index;
    const TcpStoreClientOptions c = StoreClient(options_.settings.join_timeout);
    spdlog::info("round {}: waiting for the {} of the other {} {}s on the store at {}", g.round,
                 e.contracts.NeedsPorts() ? "ports" : "joins", e.participants - 1, e.who,
                 FormatEndpoint(c.host, c.port));
    // The last round's thread watches for this round to begin: it ends once this one says so.
    std::thread last = std::move(exchange_thread_);
    const bool claim = MustClaim();
    exchange_thread_ =
        std::thread([this, g = std::move(g), self, e, c, claim, last = std::move(last)]() mutable {
          // In short tries, so that a stopping agent is not held up by a store not up yet.
          const Status claimed = claim ? ClaimRank() : Status::Ok();
          auto client = claimed.ok() ? ConnectWhile(c, std::chrono::milliseconds(250),
                                                    [this] { return !stop_exchange_; })
                                     : StatusOr<std::unique_ptr<TcpStoreClient>>(claimed);
          StatusOr<std::vector<RoundMember>> members =
              client.ok() ? ExchangeMembers(**client, self, e) : client.status();
          if (last.joinable()) last.join();
          if (!members.ok() && members.status().code() == StatusCode::kAborted) return;
          if (!members.ok()) {
            JobOutcome o;
            o.exit_code = 1;
            o.reason =
                (e.contracts.NeedsPorts() ? "--contract: " : "") + members.status().message();
            return Post([this, o] { events_->OnFinished(o); });
          }
          g.members = std::move(members).value();
          Post([this, g] { events_->OnAssignment(g); });
          auto began = WatchForRound(**client, g.round + 1, stop_exchange_);
          if (began.ok()) Post([this, round = g.round, b = *began] { PeerBegan(round, b); });
        });
  }

  // Another crun began the round after `round` (member_exchange.h): its workers failed, and
  // this crun's group restarts with it, so that every round has all the job's workers.
  // Its failure counts here as there (rdzv::OnFailure), so that every crun keeps the same
  // budget and crash-loop count; one told without it (an older crun) counts as a restart only.
  void PeerBegan(int round, const RoundBegun& began) {
    if (restarts_ != round || concluded_) return;  // this crun began it too, or is done
    const std::string what = std::string(options_.fixed_group ? "Slurm task " : "node ") +
                             std::to_string(began.index) + " began round " +
                             std::to_string(round + 1) + " after a failure there";
    rdzv::Failure failure = began.after.value_or(rdzv::Failure{});
    failure.what = what;
    if (auto fail = rdzv::OnFailure(restarts_, crash_loop_, failure, options_.settings)) {
      JobOutcome o;
      const bool loop = fail->exit_code == report::kExitDoNotRequeue;
      o.exit_code = loop ? fail->exit_code : 1;
      o.reason = loop ? fail->reason : what + ", and this crun has no restarts left";
      return Conclude(o);
    }
    events_->OnStopAndRejoin({what, true, rdzv::kStopPeer, {}});
  }

  // This crun's workers are done for good. Alone, that is the end; sharing a static store, it
  // first says so on the store, off the event loop (which serves the store when this crun
  // hosts it), and the host waits there for the others (StaticRendezvousOptions::store_linger).
  void Conclude(const JobOutcome& o) {
    concluded_ = true;
    stop_exchange_ = true;
    const int participants = Participants();
    if (!options_.static_store || participants <= 1 || done_thread_.joinable()) {
      return Post([this, o] { events_->OnFinished(o); });
    }
    const bool hosting = store_.serving();
    const TcpStoreClientOptions c = StoreClient(std::chrono::seconds(5));
    // A failure of this crun's that ends the job is told as the next round's beginning, so that
    // the others, watching for it, weigh it by the same rules and end the same way.
    std::pair<std::string, std::string> told;
    if (after_ && self_index_ >= 0) {
      told = {BegunKey(restarts_ + 1), EncodeBegun({self_index_, after_})};
    }
    done_thread_ = std::thread([this, o, c, hosting, participants, told] {
      SayDone(c, hosting, participants, told);
      Post([this, o] { events_->OnFinished(o); });
    });
  }

  void SayDone(const TcpStoreClientOptions& c, bool hosting, int participants,
               const std::pair<std::string, std::string>& told) const {
    static constexpr char kDone[] = "/crun/done";
    static constexpr char kAllDone[] = "/crun/all-done";
    const std::string where = FormatEndpoint(c.host, c.port);
    auto client = TcpStoreClient::Connect(c);
    if (!client.ok()) {
      spdlog::info("not telling the store at {} that this crun is done: {}", where,
                   client.status().message());
      return;
    }
    if (!told.first.empty()) {
      if (Status s = (*client)->Set(told.first, told.second); !s.ok()) {
        spdlog::warn("cannot tell the others on the store at {} why this crun ends: {}", where,
                     s.message());
      }
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
  StaticRendezvousOptions options_;
  RendezvousEvents* events_ = nullptr;
  RoundStoreHost store_;  // when this crun hosts the store
  int joins_ = 0;
  int restarts_ = 0;
  rdzv::CrashLoop crash_loop_;  // the job's failures in a row before any progress
  // This crun's last failure, until the next round it begins (or the job's end) tells the others.
  std::optional<rdzv::Failure> after_;
  int self_index_ = -1;          // its index on the shared store, once it exchanged there
  std::thread done_thread_;      // Conclude()'s word with the store
  std::thread exchange_thread_;  // the round's Exchange(), then its watch for the next round
  std::atomic<bool> stop_exchange_{false};
  bool concluded_ = false;
  const std::string claim_id_ = RandomClaimId();  // this crun's, in its rank's claim
};

}  // namespace

std::unique_ptr<Rendezvous> MakeStaticRendezvous(boost::asio::io_context& io,
                                                 const StaticRendezvousOptions& options) {
  return std::make_unique<StaticRendezvous>(io, options);
}

}  // namespace crun::agent
