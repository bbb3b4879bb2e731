#include "agent/rendezvous/etcd_rendezvous.h"

#include <cmath>
#include <future>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/etcd/assignment.h"
#include "agent/rendezvous/etcd/decider.h"
#include "agent/rendezvous/etcd/election.h"
#include "agent/rendezvous/etcd/node_lease.h"
#include "agent/rendezvous/etcd/round_store.h"
#include "base/endpoint.h"
#include "base/security.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/job.h"
#include "rendezvous/etcd/stragglers.h"
#include "rendezvous/report/report.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;
using etcd::Clock;
using Millis = std::chrono::milliseconds;

class EtcdRendezvous final : public Rendezvous {
 public:
  EtcdRendezvous(asio::io_context& io, EtcdRendezvousOptions o)
      : io_(io),
        o_(std::move(o)),
        keys_(o_.root, o_.run_id),
        self_{o_.run_id,
              o_.role,
              o_.node_id,
              o_.nproc,
              o_.settings.max_restarts,
              o_.virtual_local_rank},
        agent_work_(asio::make_work_guard(io)),
        work_(asio::make_work_guard(eio_)),
        decide_timer_(eio_),
        retry_timer_(eio_),
        keepalive_timer_(eio_),
        judge_(o_.straggler_settings),
        thread_([this] { eio_.run(); }) {}

  ~EtcdRendezvous() override {
    Leave("shutting down");
    work_.reset();
    eio_.stop();
    thread_.join();
  }

  void Start(RendezvousEvents* events) override {
    events_ = events;
    asio::post(eio_, [this] { Setup(); });
  }

  void Join(const std::vector<std::uint16_t>& ports) override {
    ports_ = ports;  // published with the join (its value), for the round's members
    asio::post(eio_, [this] {
      want_join_ = true;
      if (ready_) WriteJoin();
    });
  }

  void ReportFailure(const crun::report::FailureReport& failures) override {
    auto report = failures;
    report.node_id = o_.node_id;
    asio::post(eio_, [this, report = std::move(report)] {
      if (ended_ || !round_) return;
      etcd::Report r;
      r.what = crun::report::Describe(report);
      r.exit_code = crun::report::ExitCodeOf(report);
      r.report_json = crun::report::ToJson(report);
      WriteReport(r);
    });
  }

  void ReportSuccess() override {
    asio::post(eio_, [this] {
      if (ended_ || !round_) return;
      etcd::Report r;
      r.success = true;
      WriteReport(r);
    });
  }

  // Unbound to the lease: the decider reads it after this agent has left.
  void ReportUnhealthy(const std::string& why) override {
    asio::post(eio_, [this, why] {
      if (ended_ || !ready_) return;
      auto put = client_->Put(keys_.unhealthy(o_.node_id),
                              etcd::EncodeUnhealthy({o_.node_id, o_.host, why}), 0, Deadline());
      if (!put.ok()) {
        spdlog::warn("etcd rendezvous: cannot say that this node failed its health check: {}",
                     put.status().message());
      }
    });
  }

  // Revokes the lease (etcd deletes every key bound to it: nodes/, joins/, stores/) and stops.
  void Leave(const std::string& reason) override {
    auto done = std::make_shared<std::promise<void>>();
    auto left = done->get_future();
    asio::post(eio_, [this, reason, done] {
      if (!left_) {
        left_ = true;
        ended_ = true;
        StopAll();
        if (membership_) {
          auto s = membership_->Revoke(Clock::now() + Millis(2'000));
          if (!s.ok()) spdlog::warn("etcd rendezvous: leaving ({}): {}", reason, s.message());
        }
        StopStore();
      }
      done->set_value();
    });
    if (left.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      spdlog::warn("etcd rendezvous: leaving took longer than 5 s; going on");
    }
    agent_work_.reset();
  }

  std::string node_id() const override { return o_.node_id; }
  StragglerExchange* stragglers() override { return stragglers_.get(); }

  void AskStacks(const std::string& /*reason*/, std::chrono::milliseconds /*timeout*/,
                 std::function<void(RemoteStacks)> done) override {
    RemoteStacks none;
    none.missing.push_back(
        "the other nodes (reading stacks across nodes needs crun's rendezvous service; the "
        "etcd backend reads this node's only)");
    asio::post(io_, [done = std::move(done), none] { done(none); });
  }

  void ReplyStacks(std::uint64_t, const std::string&, const std::vector<RankStacks>&,
                   const std::string&) override {}

 private:
  // ---- on the etcd thread ----------------------------------------------------------------

  void Setup() {
    const std::string where = fmt::format("etcd at {}", fmt::join(o_.endpoints, ","));
    etcd::ClientOptions co;
    co.endpoints = o_.endpoints;
    co.security = o_.security;
    co.user = o_.user;
    co.password = o_.password;
    co.keepalive_timeout = std::max(Millis(1'000), o_.settings.heartbeat_timeout);
    co.probe = false;  // the first read below proves that a member answers
    // Each node starts at a member of its own (its node id's hash): a thousand agents do not
    // all connect to, and queue on, the first endpoint.
    co.first_member = std::hash<std::string>{}(o_.node_id);
    auto cannot_use = [&](const Status& why) {
      End(1, "cannot use " + where + " for run '" + o_.run_id + "' within " +
                 std::to_string(o_.connect_timeout.count()) +
                 " ms (connect_timeout): " + why.message() + "; nothing was started");
    };
    auto client = etcd::Client::Connect(co, Clock::now() + o_.connect_timeout);
    if (!client.ok()) return cannot_use(client.status());
    client_ = std::move(client).value();
    // The layout and what this node watches, in one read; then its lease, its key and (when
    // the agent is ready) its join in one write: each agent costs etcd little at 1,000 nodes.
    std::string layout;
    if (Status read = LoadMirror(&layout); !read.ok()) return cannot_use(read);
    if (!layout.empty() && layout != etcd::kLayout) {
      return End(1, where + ": " + keys_.layout() + " is '" + layout + "', this crun reads '" +
                        etcd::kLayout +
                        "': the run's keys were written by another crun version; use another "
                        "--rdzv-id or --rdzv-conf etcd_prefix, or remove " +
                        keys_.prefix + " if that job is over");
    }
    ttl_ = std::chrono::seconds(
        std::max<long long>(1, static_cast<long long>(
                                   std::ceil(o_.settings.heartbeat_timeout.count() / 1000.0))));
    const bool join = want_join_;
    const int gathering = CurrentGathering();
    if (!Register(join ? std::vector<etcd::Op>{JoinOp(gathering, 0)} : std::vector<etcd::Op>{})) {
      return;
    }
    if (join) joined_gathering_ = gathering;
    StartWatch();
    ArmKeepAlive();
    ready_ = true;
    last_contact_ = Clock::now();
    if (want_join_ && !join) WriteJoin();
    Changed();
  }

  // This node's lease and key (etcd/node_lease.h), with `with` in the same write; false when
  // that failed (the job ends here).
  bool Register(const std::vector<etcd::Op>& with = {}) {
    etcd::NodeRecord record;
    record.node.node_id = o_.node_id;
    record.node.host = o_.host;
    record.node.nproc = o_.nproc;
    record.node.requested_rank = o_.requested_rank;
    // Where other nodes' workers reach this one's (--contract): as its store is reached.
    record.node.address = o_.advertise_addr.empty() ? o_.host : o_.advertise_addr;
    record.addresses = o_.addresses;
    record.settings = o_.settings;
    membership_ = std::make_unique<EtcdNodeLease>(client_, keys_, o_.run_id, record, ttl_);
    const Status s =
        membership_->Register([this] { return Deadline(); },
                              Clock::now() + o_.settings.heartbeat_timeout + Millis(2'000), with);
    if (!s.ok()) {
      End(1, s.message());
      return false;
    }
    lease_ = membership_->id();
    node_revision_ = membership_->node_revision();
    return true;
  }

  void StartWatch() {
    watch_ = client_->WatchPrefix(
        WatchedPrefix(), revision_ + 1,
        [this](std::vector<etcd::WatchEvent> events, std::int64_t revision) {
          asio::post(eio_, [this, events = std::move(events), revision] {
            if (ended_) return;
            for (const auto& e : events) {
              if (e.deleted) {
                mirror_.erase(e.kv.key);
              } else {
                mirror_[e.kv.key] = e.kv;
                QueueFigures(e.kv);
              }
            }
            revision_ = revision;
            last_contact_ = Clock::now();
            Changed();
          });
        },
        [this](Status s) {
          asio::post(eio_, [this, s] {
            if (ended_) return;
            if (s.code() == StatusCode::kNotFound) return Resync();
            End(1, s.message());
          });
        },
        o_.outage_timeout);
  }

  // The watch fell behind etcd's compaction: read everything again and watch from there.
  void Resync() {
    watch_.reset();
    if (Status read = LoadMirror(); !read.ok()) return End(1, read.message());
    StartWatch();
    Changed();
  }

  // The decider reads and watches everything under the run's prefix; the others what they act
  // on (job.h).
  std::string WatchedPrefix() const { return watch_all_ ? keys_.prefix : keys_.announce(); }

  // What this node watches, read at one revision, and the run's layout key (`layout`, when
  // given: empty when there is none); an error when etcd did not answer.
  Status LoadMirror(std::string* layout = nullptr) {
    auto all = client_->Txn({},
                            {{etcd::Op::Kind::kGetPrefix, WatchedPrefix(), "", 0},
                             {etcd::Op::Kind::kGet, keys_.layout(), "", 0}},
                            {}, Deadline());
    if (!all.ok()) return all.status();
    mirror_.clear();
    for (auto& kv : all->reads.at(0)) mirror_[kv.key] = std::move(kv);
    if (layout != nullptr && !all->reads.at(1).empty()) *layout = all->reads.at(1).front().value;
    revision_ = all->revision;
    return Status::Ok();
  }

  void ArmKeepAlive() {
    keepalive_timer_.expires_after(membership_->interval());
    keepalive_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || ended_) return;
      Status why;
      const auto beat = membership_->KeepAlive(Clock::now() + membership_->interval(), &why);
      if (beat == EtcdNodeLease::Beat::kLost) return LeaseLost();
      if (beat == EtcdNodeLease::Beat::kAlive) {
        last_contact_ = Clock::now();
        SendFigures();
        if (outage_logged_) {
          outage_logged_ = false;
          spdlog::info("etcd rendezvous: etcd at {} answers again", client_->endpoints());
        }
      } else if (Clock::now() - last_contact_ > o_.outage_timeout) {
        return End(1, "lost etcd at " + client_->endpoints() + ": no member answered for " +
                          std::to_string(o_.outage_timeout.count()) +
                          " ms (reconnect_timeout; last: " + why.message() + ")");
      } else if (!outage_logged_) {
        outage_logged_ = true;
        spdlog::warn(
            "etcd rendezvous: {}; the workers run on while this node keeps trying (for up to "
            "{} ms, reconnect_timeout)",
            why.message(), o_.outage_timeout.count());
      }
      ArmKeepAlive();
    });
  }

  // etcd let this node's lease run out (it was cut off longer than its TTL): the others have
  // re-formed without it. Stop the workers and come back as a new member.
  void LeaseLost() {
    spdlog::warn(
        "etcd rendezvous: this node's lease ran out (cut off from etcd for longer than "
        "heartbeat_timeout {} ms): the other nodes went on without it; stopping the workers "
        "and joining again",
        o_.settings.heartbeat_timeout.count());
    StopStore();
    const bool had_round = round_.has_value();
    round_.reset();
    joined_gathering_.reset();
    if (had_round) want_join_ = false;  // the agent joins again once its workers are down
    if (!Register()) return;
    ArmKeepAlive();
    if (had_round) {
      Post([this](RendezvousEvents* e) {
        e->OnStopAndRejoin(
            "this node's etcd lease ran out (cut off for longer than "
            "heartbeat_timeout): joining again as a new member",
            false);
      });
    } else if (want_join_) {
      WriteJoin();
    }
  }

  // This node's join of `gathering`, with the ports it reserved, bound to `lease`.
  etcd::Op JoinOp(int gathering, std::int64_t lease) const {
    return {etcd::Op::Kind::kPut, keys_.join(o_.node_id), etcd::EncodeJoin({gathering, ports_}),
            lease};
  }

  void WriteJoin() {
    const int gathering = CurrentGathering();
    const etcd::Op join = JoinOp(gathering, lease_);
    auto put = client_->Put(join.key, join.value, join.lease, Deadline());
    if (put.status().code() == StatusCode::kNotFound) return LeaseLost();  // "lease not found"
    if (!put.ok()) return End(1, "cannot join run '" + o_.run_id + "': " + put.status().message());
    joined_gathering_ = gathering;
  }

  void WriteReport(const etcd::Report& r) {
    auto put = client_->Put(keys_.report(round_->gathering, o_.node_id), etcd::EncodeReport(r), 0,
                            Deadline());
    if (!put.ok())
      spdlog::warn("etcd rendezvous: cannot write this node's report: {}", put.status().message());
  }

  int CurrentGathering() {
    auto job = mirror_.find(keys_.job());
    if (job == mirror_.end()) return 0;
    auto doc = etcd::DecodeJob(job->second.value, rdzv::TimePoint(), etcd::WallClock::now());
    return doc.ok() ? doc->gathering : 0;
  }

  // Something under the prefix changed (or time passed): act on the job document, and decide
  // if this node is the one that does.
  // Coalesced: what the watch has queued is applied first, and one pass acts on all of it (a
  // thousand joins arriving together are one decision, not a thousand).
  void Changed() {
    if (ended_ || pass_queued_) return;
    pass_queued_ = true;
    asio::post(eio_, [this] {
      pass_queued_ = false;
      if (ended_) return;
      React();
      if (!ended_) Elect();
      if (!ended_ && watch_all_) Decide();
      if (!ended_ && watch_all_) JudgeFigures();
    });
  }

  // ---- slow ranks judged job-wide (rendezvous/etcd/stragglers.h) ----------------------------

  // The decider keeps every put of a node's figures, in order, for its next pass.
  void QueueFigures(const etcd::KeyValue& kv) {
    const std::string prefix = etcd::FiguresKey(keys_, "");
    if (!watch_all_ || !stragglers_ || kv.key.compare(0, prefix.size(), prefix) != 0) return;
    if (figures_.size() >= kMaxQueuedFigures) figures_.erase(figures_.begin());
    figures_.emplace_back(kv.key.substr(prefix.size()), kv.value);
  }

  // The decider folds the puts into the running round's detector and writes what changed.
  void JudgeFigures() {
    auto queued = std::exchange(figures_, {});
    if (queued.empty() || etcd::Decider(keys_, mirror_) != o_.node_id) return;
    auto job = mirror_.find(keys_.state());  // with the members, which a/job may leave out
    if (job == mirror_.end()) return;
    auto doc =
        etcd::DecodeJob(job->second.value, rdzv::TimePoint::clock::now(), etcd::WallClock::now());
    if (!doc.ok()) return;
    judge_.Follow(*doc);
    bool changed = false;
    for (const auto& [node, value] : queued) {
      auto put = etcd::DecodeFigures(node, value);
      if (!put.ok()) {
        spdlog::warn("etcd rendezvous: ignoring {}", put.status().message());
        continue;
      }
      changed = judge_.Fold(node, *put) || changed;
    }
    if (!changed) return;
    auto written = client_->Put(etcd::StragglersKey(keys_), etcd::EncodeVerdicts(judge_.verdicts()),
                                0, Deadline());
    if (!written.ok()) {
      spdlog::warn("etcd rendezvous: cannot write the slow ranks' verdicts: {}",
                   written.status().message());
    }
  }

  // Every node, each keep-alive: the figures its straggler watch queued since the last put.
  void SendFigures() {
    if (!stragglers_ || !round_) return;
    asio::post(io_, [this] {
      StragglerExchange& x = *stragglers_;
      if (!x.job_wide || x.outbox.empty()) return;
      etcd::NodeFigures put{x.round, std::exchange(x.outbox, {})};
      asio::post(eio_, [this, put = std::move(put)] {
        if (ended_ || !ready_) return;
        auto written = client_->Put(etcd::FiguresKey(keys_, o_.node_id), etcd::EncodeFigures(put),
                                    lease_, Deadline());
        if (!written.ok()) {
          spdlog::warn("etcd rendezvous: cannot send this node's slow-rank figures: {}",
                       written.status().message());
        }
      });
    });
  }

  // Every node: the decider's verdicts on this round's ranks that it has not passed on yet.
  void PassVerdicts() {
    if (!stragglers_ || !round_) return;
    auto kv = mirror_.find(etcd::StragglersKey(keys_));
    if (kv == mirror_.end()) return;
    auto verdicts = etcd::DecodeVerdicts(kv->second.value);
    if (!verdicts.ok()) return;
    auto changes = etcd::NewVerdicts(*verdicts, round_->round, said_slow_);
    if (changes.empty()) return;
    std::vector<SlowRankVerdict> out;
    for (const auto& v : changes) out.push_back({v.change, v.host});
    asio::post(io_, [this, out = std::move(out)] {
      if (stragglers_->on_verdicts) stragglers_->on_verdicts(out);
    });
  }

  void React() {
    // This node's key is gone though the watch has seen past its creation: the lease ran out.
    // (Only the decider watches nodes/; the others learn it from their next keep-alive.)
    if (watch_all_ && revision_ >= node_revision_ && mirror_.count(keys_.node(o_.node_id)) == 0) {
      return LeaseLost();
    }
    if (auto refused = mirror_.find(keys_.refusal(o_.node_id)); refused != mirror_.end()) {
      return End(1, "the etcd rendezvous refused this node (run '" + o_.run_id + "', node '" +
                        o_.node_id + "'): " + refused->second.value);
    }
    auto job = mirror_.find(keys_.job());
    if (job == mirror_.end()) return;
    const auto now = rdzv::TimePoint::clock::now();
    auto decoded = etcd::DecodeJob(job->second.value, now, etcd::WallClock::now());
    if (!decoded.ok()) {
      return End(1, keys_.job() + " cannot be read: " + decoded.status().message());
    }
    const etcd::JobDoc& doc = *decoded;
    // An outcome written while this node was part of the job is this node's.
    if (doc.outcome && node_revision_ < job->second.mod_revision) return Finish(doc);
    if (round_ && doc.gathering != round_->gathering) {
      round_.reset();
      StopStore();
      Post([reason = doc.stop_reason, spends = doc.stop_spends_restart](RendezvousEvents* e) {
        e->OnStopAndRejoin(reason, spends);
      });
      return;
    }
    if (round_) return PassVerdicts();
    if (want_join_ && joined_gathering_ != doc.gathering) WriteJoin();
    if (joined_gathering_ != doc.gathering || doc.state.phase != rdzv::Phase::kRunning) return;
    MaybeAssign(doc);
  }

  void MaybeAssign(const etcd::JobDoc& doc) {
    auto place = ReadPlace(doc);
    if (!place) return;
    auto assigned = EtcdAssignment(doc, *place, self_);
    if (!assigned) return;  // not in this round: the decider will see our join
    GroupAssignment& g = *assigned;
    const int round = doc.state.round;
    if (!g.spare) {
      if (HostsRoundStore(g) && !HostStore(round)) return;
      auto store = mirror_.find(keys_.store(round));
      if (store == mirror_.end()) return;  // its host has not written it yet
      auto endpoint = ParseEndpoint(store->second.value, 0);
      if (!endpoint.ok()) {
        return End(1, keys_.store(round) + " holds '" + store->second.value +
                          "', not host:port: " + endpoint.status().message());
      }
      g.master_addr = endpoint->host;
      g.master_port = endpoint->port;
    }
    round_ = Round{doc.gathering, round};
    said_slow_.clear();
    want_join_ = false;  // until the agent is ready for the next round
    spdlog::info("etcd rendezvous: round {} ({}), restart count {}", round,
                 g.spare ? std::string("spare") : "group rank " + std::to_string(g.group_rank),
                 g.restart_count);
    // A decider that judges slow ranks gets this node's figures; else the node judges alone.
    Post([this, g, judges = doc.judges_stragglers](RendezvousEvents* e) {
      if (stragglers_) stragglers_->job_wide = judges;
      e->OnAssignment(g);
    });
  }

  // This node's ranks/ record of the decision `doc` announces: read once per decision (the
  // decider's is in its mirror). Nothing while the record is another decision's (this node is
  // not in the round, or a newer decision is on its way: a change of a/job follows) or etcd did
  // not answer (read again in 500 ms); a record that cannot be read ends the job.
  std::optional<etcd::RankRecord> ReadPlace(const etcd::JobDoc& doc) {
    if (place_ && place_->token == doc.ranks_token) return place_;
    std::optional<etcd::KeyValue> kv;
    if (auto it = mirror_.find(keys_.rank(o_.node_id)); watch_all_ && it != mirror_.end()) {
      kv = it->second;
    } else {
      auto read = client_->Get(keys_.rank(o_.node_id), Deadline());
      if (!read.ok()) {
        spdlog::warn("etcd rendezvous: cannot read this node's place in round {}: {}",
                     doc.state.round, read.status().message());
        retry_timer_.expires_after(Millis(500));
        retry_timer_.async_wait([this](const boost::system::error_code& ec) {
          if (!ec) Changed();
        });
        return std::nullopt;
      }
      if (!read->kvs.empty()) kv = std::move(read->kvs.front());
    }
    if (!kv) return std::nullopt;
    auto place = etcd::DecodeRank(o_.node_id, kv->value);
    if (!place.ok()) {
      End(1, kv->key + " cannot be read: " + place.status().message());
      return std::nullopt;
    }
    if (place->token != doc.ranks_token) return std::nullopt;
    place_ = *place;
    return place_;
  }

  // Group rank 0 serves the round's store and says where; false when that failed (the job
  // ends here).
  bool HostStore(int round) {
    if (!round_store_) {
      round_store_ =
          std::make_unique<EtcdRoundStore>(client_, keys_,
                                           o_.advertise_addr.empty() ? o_.host : o_.advertise_addr);
    }
    if (round_store_->serving(round)) return true;
    // Who the members are (rounds/<round>) and their addresses (nodes/): in the decider's
    // mirror, read once per round, in one transaction, by another.
    etcd::Mirror read;
    if (!watch_all_) {
      auto both = client_->Txn({},
                               {{etcd::Op::Kind::kGetPrefix, keys_.nodes(), "", 0},
                                {etcd::Op::Kind::kGet, keys_.round(round), "", 0}},
                               {}, Deadline());
      if (!both.ok()) {
        End(1, "cannot read the members' addresses for round " + std::to_string(round) +
                   "'s store: " + both.status().message());
        return false;
      }
      for (auto& kvs : both->reads) {
        for (auto& kv : kvs) read[kv.key] = std::move(kv);
      }
    }
    const etcd::Mirror& records = watch_all_ ? mirror_ : read;
    auto history_kv = records.find(keys_.round(round));
    if (history_kv == records.end()) {
      End(1, keys_.round(round) + " is missing: the round's members are not known");
      return false;
    }
    auto history = etcd::DecodeRound(history_kv->second.value);
    if (!history.ok()) {
      End(1, keys_.round(round) + " cannot be read: " + history.status().message());
      return false;
    }
    auto endpoint = round_store_->Serve(*history, records, lease_, Deadline());
    if (!endpoint.ok()) {
      End(1, endpoint.status().message());
      return false;
    }
    mirror_[keys_.store(round)].value = *endpoint;
    return true;
  }

  // No node decides (the first agents, or the decider's lease ended): try to become the one.
  // The one that does reads and watches everything from then on.
  void Elect() {
    const std::string who = etcd::Decider(keys_, mirror_);
    if (who == o_.node_id) {
      if (!watch_all_) {
        watch_all_ = true;
        Resync();
      }
      return;
    }
    if (!who.empty() || elect_tried_at_ == revision_) return;
    elect_tried_at_ = revision_;  // once per state of the mirror: the watch brings the winner
    const Status stood = StandAsDecider(*client_, keys_, o_.node_id, lease_, Deadline());
    if (stood.code() == StatusCode::kNotFound) return LeaseLost();
    if (!stood.ok()) {
      spdlog::warn("etcd rendezvous: cannot stand as the decider: {}", stood.message());
      elect_tried_at_ = -1;
      decide_timer_.expires_after(Millis(500));
      decide_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (!ec) Changed();
      });
    }
  }

  void Decide() {
    if (etcd::Decider(keys_, mirror_) != o_.node_id) return;
    // The last transaction's revision not seen yet: the watch brings it, and a pass follows.
    if (revision_ < seen_needed_) return;
    auto d = DecideAndWrite(*client_, keys_, mirror_, o_.node_id, rdzv::TimePoint::clock::now(),
                            Deadline(), o_.retention);
    if (!d.error.ok()) return End(1, d.error.message());
    if (!d.unanswered.ok()) spdlog::warn("etcd rendezvous: deciding: {}", d.unanswered.message());
    if (d.written_revision != 0) seen_needed_ = d.written_revision;
    for (const auto& line : d.log) spdlog::info("etcd rendezvous: {}: {}", o_.run_id, line);
    // Lost the race: the watch brings the newer document, and this runs again.
    if (d.wake_at) {
      decide_timer_.expires_at(*d.wake_at + Millis(1));
      decide_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (!ec) Changed();
      });
    }
  }

  void Finish(const etcd::JobDoc& doc) {
    const auto& o = *doc.outcome;
    JobOutcome out;
    out.success = o.success;
    out.exit_code = o.exit_code;
    out.reason = o.reason;
    out.root_node_id = o.root_node_id;
    if (!o.root_report_json.empty()) {
      if (auto report = crun::report::FromJson(o.root_report_json); report.ok()) {
        out.root_report = std::move(*report);
      } else {
        spdlog::warn("the job's root cause in etcd cannot be read: {}", report.status().message());
      }
    }
    ended_ = true;
    StopAll();
    Post([out](RendezvousEvents* e) { e->OnFinished(out); });
  }

  void End(int code, const std::string& reason) {
    if (ended_) return;
    ended_ = true;
    StopAll();
    spdlog::error("{}", reason);
    JobOutcome out;
    out.exit_code = code;
    out.reason = reason;
    Post([out](RendezvousEvents* e) { e->OnFinished(out); });
  }

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
    asio::post(io_, [this, f = std::move(f)] {
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

  asio::io_context& io_;
  EtcdRendezvousOptions o_;
  // Slow ranks judged job-wide: shared with posts that may outlive a call.
  std::shared_ptr<StragglerExchange> stragglers_ = std::make_shared<StragglerExchange>();
  etcd::Keys keys_;
  RoundSelf self_;
  asio::executor_work_guard<asio::io_context::executor_type> agent_work_;
  RendezvousEvents* events_ = nullptr;
  // Everything below is the etcd thread's.
  asio::io_context eio_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::steady_timer decide_timer_;
  asio::steady_timer retry_timer_;  // a read of this node's place that etcd did not answer
  asio::steady_timer keepalive_timer_;
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
  // Slow ranks: the decider's detector and the puts of figures since its last pass (node id,
  // value); every node's ranks it has said are slow in its round.
  static constexpr std::size_t kMaxQueuedFigures = 100'000;
  etcd::FigureJudge judge_;
  std::vector<std::pair<std::string, std::string>> figures_;
  std::set<int> said_slow_;
  Clock::time_point last_contact_;
  std::thread thread_;  // last: runs eio_ once everything above is built
};

}  // namespace

std::unique_ptr<Rendezvous> MakeEtcdRendezvous(asio::io_context& io,
                                               const EtcdRendezvousOptions& options) {
  return std::make_unique<EtcdRendezvous>(io, options);
}

}  // namespace crun::agent
