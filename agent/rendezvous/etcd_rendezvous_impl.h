// EtcdRendezvous (etcd_rendezvous.h), shared by its halves: the node's membership of the run
// (etcd_rendezvous.cc: the agent's calls, the client, the lease, the watch and its mirror) and
// the job's rounds as this node follows them (etcd_rounds.cc: its join, the job document, its
// place and the round's store, the decider's seat). Each role below it is a file of
// agent/rendezvous/etcd/.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/rendezvous/etcd/node_lease.h"
#include "agent/rendezvous/etcd/round_store.h"
#include "agent/rendezvous/etcd/slow_ranks.h"
#include "agent/rendezvous/etcd_rendezvous.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/goodput.h"
#include "rendezvous/etcd/job.h"

namespace crun::agent {

class EtcdRendezvous final : public Rendezvous {
 public:
  using Clock = etcd::Clock;
  using Millis = std::chrono::milliseconds;

  EtcdRendezvous(boost::asio::io_context& io, EtcdRendezvousOptions o)
      : io_(io),
        o_(std::move(o)),
        keys_(o_.root, o_.run_id),
        self_{o_.run_id,
              o_.role,
              o_.node_id,
              o_.nproc,
              o_.settings.max_restarts,
              o_.virtual_local_rank},
        agent_work_(boost::asio::make_work_guard(io)),
        work_(boost::asio::make_work_guard(eio_)),
        decide_timer_(eio_),
        retry_timer_(eio_),
        keepalive_timer_(eio_),
        slow_(keys_, o_.straggler_settings),
        thread_([this] { eio_.run(); }) {}

  ~EtcdRendezvous() override {
    Leave("shutting down");
    work_.reset();
    eio_.stop();
    thread_.join();
  }

  // ---- the agent's calls (etcd_rendezvous.cc): posted to the etcd thread ----
  void Start(RendezvousEvents* events) override;
  void Join(const std::vector<std::uint16_t>& ports) override;
  void ReportFailure(const crun::report::FailureReport& failures) override;
  void ReportSuccess() override;
  void ReportUnhealthy(const std::string& why) override;
  void ShareGoodput(const std::string& ledger_json) override;
  void Leave(const std::string& reason) override;

  std::string node_id() const override { return o_.node_id; }
  StragglerExchange* stragglers() override { return stragglers_.get(); }

  void AskStacks(const std::string& /*reason*/, std::chrono::milliseconds /*timeout*/,
                 std::function<void(RemoteStacks)> done) override;

  void ReplyStacks(std::uint64_t, const std::string&, const std::vector<RankStacks>&,
                   const std::string&) override {}

 private:
  // ---- on the etcd thread: membership (etcd_rendezvous.cc): connect, lease, watch ----
  void Setup();
  bool Register(const std::vector<etcd::Op>& with = {});
  void StartWatch();
  void Resync();

  // The decider reads and watches everything under the run's prefix; the others what they act
  // on (job.h).
  std::string WatchedPrefix() const { return watch_all_ ? keys_.prefix : keys_.announce(); }

  Status LoadMirror(std::string* layout = nullptr);
  void ArmKeepAlive();
  void LeaseLost();

  // ---- on the etcd thread: rounds (etcd_rounds.cc): join, follow the job document, take this
  // node's place, serve the store, stand as and act as the decider ----
  etcd::Op JoinOp(int gathering, std::int64_t lease) const;
  void WriteJoin();
  void WriteReport(const etcd::Report& r);
  void PutLedger(const std::string& value);  // this node's goodput ledger (etcd/goodput.h)
  int CurrentGathering();
  void Changed();
  void SendFigures();
  void React();
  void MaybeAssign(const etcd::JobDoc& doc);
  std::optional<etcd::RankRecord> ReadPlace(const etcd::JobDoc& doc);
  bool HostStore(int round);
  void Elect();
  void Decide();
  void Finish(const etcd::JobDoc& doc);
  // ---- either ----
  void End(int code, const std::string& reason);

  void StopStore() {
    if (round_store_) round_store_->Stop();
  }

  void StopAll() {
    watch_.reset();
    decide_timer_.cancel();
    retry_timer_.cancel();
    keepalive_timer_.cancel();
  }

  // Runs `f` with the agent's events on the agent's loop.
  template <typename F>
  void Post(F f) {
    boost::asio::post(io_, [this, f = std::move(f)] {
      if (events_ != nullptr) f(events_);
    });
  }

  // Calls during the job may wait out an etcd outage; at the start they may not.
  Clock::time_point Deadline() const {
    return Clock::now() + (ready_ ? o_.outage_timeout : o_.connect_timeout);
  }

  struct Round {
    int gathering = 0;
    int round = 0;
  };

  boost::asio::io_context& io_;
  EtcdRendezvousOptions o_;
  // Slow ranks judged job-wide: shared with posts that may outlive a call.
  std::shared_ptr<StragglerExchange> stragglers_ = std::make_shared<StragglerExchange>();
  etcd::Keys keys_;
  RoundSelf self_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> agent_work_;
  RendezvousEvents* events_ = nullptr;
  etcd::LedgerPuts ledger_puts_;  // the agent thread's: when this node's ledger is put
  // Everything below is the etcd thread's.
  boost::asio::io_context eio_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::steady_timer decide_timer_;
  boost::asio::steady_timer retry_timer_;  // a read of this node's place that etcd did not answer
  boost::asio::steady_timer keepalive_timer_;
  std::shared_ptr<etcd::Client> client_;
  std::unique_ptr<etcd::Client::Watch> watch_;
  etcd::Mirror mirror_;
  std::int64_t revision_ = 0;
  std::unique_ptr<EtcdNodeLease> membership_;  // this node's lease and key
  std::int64_t lease_ = 0;                     // its id: what the node's writes are bound to
  std::chrono::seconds ttl_{3};
  std::int64_t node_revision_ = 0;  // when this node's key was created
  bool watch_all_ = false;          // this node decides: it reads the whole prefix
  std::int64_t elect_tried_at_ = -1;
  bool ready_ = false;
  bool want_join_ = false;
  std::optional<int> joined_gathering_;
  std::optional<Round> round_;             // the round whose assignment the agent has
  std::optional<etcd::RankRecord> place_;  // this node's ranks/ record, last read
  std::vector<std::uint16_t> ports_;       // this node's for the next round, sent with its join
  std::unique_ptr<EtcdRoundStore> round_store_;  // when this node serves a round's store
  bool ended_ = false;
  bool left_ = false;
  bool outage_logged_ = false;
  bool pass_queued_ = false;
  std::int64_t seen_needed_ = 0;  // the revision the mirror must reach before deciding again
  EtcdSlowRanks slow_;            // slow ranks judged job-wide
  Clock::time_point last_contact_;
  std::thread thread_;  // last: runs eio_ once everything above is built
};

}  // namespace crun::agent
