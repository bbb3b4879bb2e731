// The etcd rendezvous's rounds (etcd_rendezvous_impl.h).
#include "agent/rendezvous/etcd_rendezvous_impl.h"

#include <utility>

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/etcd/assignment.h"
#include "agent/rendezvous/etcd/decider.h"
#include "agent/rendezvous/etcd/election.h"
#include "base/endpoint.h"
#include "base/security.h"
#include "rendezvous/goodput/ledger_json.h"

namespace crun::agent {

namespace asio = boost::asio;

// This node's join of `gathering`, with the ports it reserved, bound to `lease`.
etcd::Op EtcdRendezvous::JoinOp(int gathering, std::int64_t lease) const {
  return {etcd::Op::Kind::kPut, keys_.join(o_.node_id), etcd::EncodeJoin({gathering, ports_}),
          lease};
}

void EtcdRendezvous::WriteJoin() {
  const int gathering = CurrentGathering();
  const etcd::Op join = JoinOp(gathering, lease_);
  auto put = client_->Put(join.key, join.value, join.lease, Deadline());
  if (put.status().code() == StatusCode::kNotFound) return LeaseLost();  // "lease not found"
  if (!put.ok()) return End(1, "cannot join run '" + o_.run_id + "': " + put.status().message());
  joined_gathering_ = gathering;
}

void EtcdRendezvous::WriteReport(const etcd::Report& r) {
  auto put = client_->Put(keys_.report(round_->gathering, o_.node_id), etcd::EncodeReport(r), 0,
                          Deadline());
  if (!put.ok())
    spdlog::warn("etcd rendezvous: cannot write this node's report: {}", put.status().message());
}

int EtcdRendezvous::CurrentGathering() {
  auto job = mirror_.find(keys_.job());
  if (job == mirror_.end()) return 0;
  auto doc = etcd::DecodeJob(job->second.value, rdzv::TimePoint(), etcd::WallClock::now());
  return doc.ok() ? doc->gathering : 0;
}

// Something under the prefix changed (or time passed): act on the job document, and decide
// if this node is the one that does.
// Coalesced: what the watch has queued is applied first, and one pass acts on all of it (a
// thousand joins arriving together are one decision, not a thousand).
void EtcdRendezvous::Changed() {
  if (ended_ || pass_queued_) return;
  pass_queued_ = true;
  asio::post(eio_, [this] {
    pass_queued_ = false;
    if (ended_) return;
    React();
    if (!ended_) Elect();
    if (!ended_ && watch_all_) Decide();
    if (!ended_ && watch_all_ && etcd::Decider(keys_, mirror_) == o_.node_id) {
      slow_.Judge(*client_, mirror_, Deadline());
    }
  });
}

// Every node, each keep-alive: the figures its straggler watch queued since the last put.
void EtcdRendezvous::SendFigures() {
  if (!round_) return;
  asio::post(io_, [this] {
    StragglerExchange& x = *stragglers_;
    if (!x.job_wide || x.outbox.empty()) return;
    asio::post(eio_, [this, put = etcd::NodeFigures{x.round, std::exchange(x.outbox, {})}] {
      if (!ended_ && ready_) slow_.Send(*client_, o_.node_id, put, lease_, Deadline());
    });
  });
}

void EtcdRendezvous::React() {
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
    StopNotice stop{doc.stop_reason, doc.stop_spends_restart, doc.stop_kind, {}};
    if (doc.stop_fault_ms > 0) {
      const auto wall_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               etcd::WallClock::now().time_since_epoch())
                               .count();
      stop.fault_ago =
          std::chrono::milliseconds(std::max<std::int64_t>(wall_ms - doc.stop_fault_ms, 0));
    }
    Post([stop = std::move(stop)](RendezvousEvents* e) { e->OnStopAndRejoin(stop); });
    return;
  }
  if (round_) {
    if (auto out = slow_.Unsaid(mirror_, round_->round); !out.empty()) {
      asio::post(io_, [this, out = std::move(out)] {
        if (stragglers_->on_verdicts) stragglers_->on_verdicts(out);
      });
    }
    return;
  }
  if (want_join_ && joined_gathering_ != doc.gathering) WriteJoin();
  if (joined_gathering_ != doc.gathering || doc.state.phase != rdzv::Phase::kRunning) return;
  MaybeAssign(doc);
}

void EtcdRendezvous::MaybeAssign(const etcd::JobDoc& doc) {
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
  slow_.NewRound();
  want_join_ = false;  // until the agent is ready for the next round
  spdlog::info("etcd rendezvous: round {} ({}), restart count {}", round,
               g.spare ? std::string("spare") : "group rank " + std::to_string(g.group_rank),
               g.restart_count);
  // A decider that judges slow ranks gets this node's figures; else the node judges alone.
  Post([this, g, judges = doc.judges_stragglers](RendezvousEvents* e) {
    stragglers_->job_wide = judges;
    e->OnAssignment(g);
  });
}

// This node's ranks/ record of the decision `doc` announces: read once per decision (the
// decider's is in its mirror). Nothing while the record is another decision's (this node is
// not in the round, or a newer decision is on its way: a change of a/job follows) or etcd did
// not answer (read again in 500 ms); a record that cannot be read ends the job.
std::optional<etcd::RankRecord> EtcdRendezvous::ReadPlace(const etcd::JobDoc& doc) {
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
bool EtcdRendezvous::HostStore(int round) {
  if (!round_store_) {
    round_store_ =
        std::make_unique<EtcdRoundStore>(client_, keys_,
                                         o_.advertise_addr.empty() ? o_.host : o_.advertise_addr);
  }
  auto endpoint =
      round_store_->ServeRound(round, watch_all_ ? &mirror_ : nullptr, lease_, Deadline());
  if (!endpoint.ok()) {
    End(1, endpoint.status().message());
    return false;
  }
  mirror_[keys_.store(round)].value = *endpoint;
  return true;
}

// No node decides (the first agents, or the decider's lease ended): try to become the one.
// The one that does reads and watches everything from then on.
void EtcdRendezvous::Elect() {
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

void EtcdRendezvous::Decide() {
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

void EtcdRendezvous::Finish(const etcd::JobDoc& doc) {
  JobOutcome out = EtcdOutcome(*doc.outcome);
  // The job's goodput as the decider combined it (in the transaction of the outcome).
  if (auto kv = mirror_.find(etcd::JobGoodputKey(keys_)); kv != mirror_.end()) {
    if (auto job = etcd::DecodeJobGoodput(kv->second.value); job.ok()) {
      out.job_goodput = goodput::JobJson(job->job).dump();
      out.job_nodes = job->nodes;
    } else {
      spdlog::warn("etcd rendezvous: {}", job.status().message());
    }
  }
  ended_ = true;
  StopAll();
  Post([out](RendezvousEvents* e) { e->OnFinished(out); });
}

}  // namespace crun::agent
