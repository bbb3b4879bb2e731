// The etcd rendezvous: the agent's calls and the node's membership (etcd_rendezvous_impl.h).
#include "agent/rendezvous/etcd_rendezvous_impl.h"

#include <future>
#include <utility>

#include <boost/asio/post.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/etcd/assignment.h"
#include "base/security.h"
#include "rendezvous/goodput/ledger_json.h"
#include "rendezvous/report/report.h"

namespace crun::agent {

namespace asio = boost::asio;

void EtcdRendezvous::Start(RendezvousEvents* events) {
  events_ = events;
  asio::post(eio_, [this] { Setup(); });
}

void EtcdRendezvous::Join(const std::vector<std::uint16_t>& ports) {
  ports_ = ports;  // published with the join (its value), for the round's members
  asio::post(eio_, [this] {
    want_join_ = true;
    if (ready_) WriteJoin();
  });
}

// Each report comes after this node's ledger as it stands then (the feature shares it just
// before), which the decider combines the job's from.
void EtcdRendezvous::ReportFailure(const crun::report::FailureReport& failures) {
  asio::post(eio_, [this, report = failures, ledger = ledger_puts_.Flush()] {
    if (ended_ || !round_) return;
    if (ledger) PutLedger(*ledger);
    WriteReport(EtcdFailure(report));
  });
}

void EtcdRendezvous::ReportSuccess() {
  asio::post(eio_, [this, ledger = ledger_puts_.Flush()] {
    if (ended_ || !round_) return;
    if (ledger) PutLedger(*ledger);
    etcd::Report r;
    r.success = true;
    WriteReport(r);
  });
}

// At a low rate (etcd::LedgerPuts), unbound to the lease: a lost node's time stays in the
// job's, which the decider combines at the end (rendezvous/etcd/goodput.h).
void EtcdRendezvous::ShareGoodput(const std::string& ledger_json) {
  auto ledger = goodput::NodeFromText(ledger_json, o_.node_id);
  if (!ledger.ok()) return;  // the agent's own: cannot be wrong
  auto value = ledger_puts_.Offer(Clock::now(), *ledger);
  if (!value) return;
  asio::post(eio_, [this, value = std::move(*value)] {
    if (!ended_) PutLedger(value);
  });
}

void EtcdRendezvous::PutLedger(const std::string& value) {
  if (!ready_) return;
  auto put = client_->Put(etcd::LedgerKey(keys_, o_.node_id), value, 0, Deadline());
  if (!put.ok()) {
    spdlog::warn("etcd rendezvous: cannot put this node's goodput ledger: {}",
                 put.status().message());
  }
}

// Unbound to the lease: the decider reads it after this agent has left.
void EtcdRendezvous::ReportUnhealthy(const std::string& why) {
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
void EtcdRendezvous::Leave(const std::string& reason) {
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

void EtcdRendezvous::AskStacks(const std::string& /*reason*/, std::chrono::milliseconds /*timeout*/,
                               std::function<void(RemoteStacks)> done) {
  RemoteStacks none;
  none.missing.push_back(
      "the other nodes (reading stacks across nodes needs crun's rendezvous service; the "
      "etcd backend reads this node's only)");
  asio::post(io_, [done = std::move(done), none] { done(none); });
}

void EtcdRendezvous::Setup() {
  const std::string where = fmt::format("etcd at {}", fmt::join(o_.endpoints, ","));
  auto cannot_use = [&](const Status& why) {
    End(1, "cannot use " + where + " for run '" + o_.run_id + "' within " +
               std::to_string(o_.connect_timeout.count()) +
               " ms (connect_timeout): " + why.message() + "; nothing was started");
  };
  auto client = etcd::Client::Connect(ClientOptionsOf(o_), Clock::now() + o_.connect_timeout);
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
  ttl_ = LeaseTtl(o_);
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
bool EtcdRendezvous::Register(const std::vector<etcd::Op>& with) {
  membership_ = std::make_unique<EtcdNodeLease>(client_, keys_, o_.run_id, NodeRecordOf(o_), ttl_);
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

void EtcdRendezvous::StartWatch() {
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
              if (watch_all_) slow_.Queue(e.kv);
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
void EtcdRendezvous::Resync() {
  watch_.reset();
  if (Status read = LoadMirror(); !read.ok()) return End(1, read.message());
  StartWatch();
  Changed();
}

// What this node watches, read at one revision, and the run's layout key (`layout`, when
// given: empty when there is none); an error when etcd did not answer.
Status EtcdRendezvous::LoadMirror(std::string* layout) {
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

void EtcdRendezvous::ArmKeepAlive() {
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
void EtcdRendezvous::LeaseLost() {
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
          {"this node's etcd lease ran out (cut off for longer than "
           "heartbeat_timeout): joining again as a new member",
           false,
           rdzv::kStopNodeLost,
           {}});
    });
  } else if (want_join_) {
    WriteJoin();
  }
}

void EtcdRendezvous::End(int code, const std::string& reason) {
  if (ended_) return;
  ended_ = true;
  StopAll();
  spdlog::error("{}", reason);
  JobOutcome out;
  out.exit_code = code;
  out.reason = reason;
  Post([out](RendezvousEvents* e) { e->OnFinished(out); });
}

std::unique_ptr<Rendezvous> MakeEtcdRendezvous(asio::io_context& io,
                                               const EtcdRendezvousOptions& options) {
  return std::make_unique<EtcdRendezvous>(io, options);
}

}  // namespace crun::agent
