#include "agent/rendezvous/service_rendezvous.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/beat_sender.h"
#include "agent/rendezvous/session_client.h"
#include "agent/rendezvous/session_wire.h"
#include "agent/rendezvous/session_words.h"
#include "base/backoff.h"
#include "base/endpoint.h"
#include "base/security.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;

class ServiceRendezvous final : public Rendezvous {
 public:
  ServiceRendezvous(asio::io_context& io, ServiceRendezvousOptions o)
      : io_(io),
        o_(std::move(o)),
        heartbeat_(io),
        join_timer_(io),
        reconnect_timer_(io),
        probe_(io),
        probe_timer_(io),
        probe_backoff_(std::chrono::milliseconds(5), std::chrono::seconds(1), 1.5, 0.2,
                       std::random_device{}()),
        incarnation_((std::uint64_t{std::random_device{}()} << 32) | std::random_device{}()),
        work_(asio::make_work_guard(io)),
        target_(FormatEndpoint(o_.endpoint_host, o_.endpoint_port)) {}

  ~ServiceRendezvous() override { Leave("shutting down"); }

  void Start(RendezvousEvents* events) override {
    events_ = events;
    // Reachability: the service enforces the join timeout once we reach it; this timer only
    // ends a wait for an endpoint that never answered.
    join_timer_.expires_after(o_.settings.join_timeout);
    join_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || Ended() || Heard()) return;
      join_deadline_passed_ = true;
      // Connected: the service enforces the join timeout itself and will say so.
      if (channel_ && channel_->GetState(false) == GRPC_CHANNEL_READY) return;
      EndUnreachable();
    });
    // The channel connects only when the session starts; creating it first gets gRPC's
    // start-up out of the way while the probe waits.
    ChannelOptions co;
    co.keepalive_interval = o_.heartbeat_interval;
    co.keepalive_timeout = o_.keepalive_timeout;
    co.security = o_.security;
    channel_ = MakeChannel(target_, co);
    stub_ = v1::Rendezvous::NewStub(channel_);
    boost::system::error_code ec;
    asio::ip::tcp::resolver resolver(io_);
    probe_targets_ = resolver.resolve(o_.endpoint_host, std::to_string(o_.endpoint_port), ec);
    if (ec) {
      OpenSession(false);  // gRPC resolves again and reports; the join timer bounds the wait
    } else {
      Probe();
    }
  }

  void Join(const std::vector<std::uint16_t>& ports) override {
    if (Ended()) return;
    ports_ = ports;
    if (!client_) {  // still waiting for the endpoint to listen
      join_pending_ = true;
      return;
    }
    client_->Send(JoinMessage(""));
    if (!goodput_.empty()) client_->Send(GoodputMessage(goodput_));
    join_sent_ = true;
  }

  // The node failed its health gate: the service counts and names it; it never joins. A
  // check can fail before the endpoint listens (the host node is still starting): the report
  // waits for the session, and Leave for the report (TellThenLeave).
  void ReportUnhealthy(const std::string& why) override {
    if (Ended()) return;
    if (!client_) {
      unhealthy_ = why;
      return;
    }
    client_->Send(JoinMessage(why));
  }

  v1::AgentMessage JoinMessage(const std::string& unhealthy) const {
    return agent::JoinMessage(o_, incarnation_, ports_, unhealthy);
  }

  void ReportFailure(const report::FailureReport& failures) override {
    if (Ended() || !client_) return;
    client_->Send(FailureMessage(failures));
  }

  void ReportSuccess() override {
    if (Ended() || !client_) return;
    client_->Send(SucceededMessage());
  }

  // Sent now where the node has joined on this session, and again after every join, so that
  // a daemon that restarts has it back.
  void ShareGoodput(const std::string& ledger_json) override {
    goodput_ = ledger_json;
    if (!Ended() && client_ && join_sent_) client_->Send(GoodputMessage(goodput_));
  }

  void Leave(const std::string& reason) override {
    if (state_ == State::kLeft || state_ == State::kTelling) return;
    if (!client_ && unhealthy_ && !Ended()) return TellThenLeave(reason);
    const bool waiting = Reconnecting();
    state_ = State::kLeft;
    StopTimers();
    if (client_ && waiting) {
      client_->Cancel();  // a session still waiting for the service: nobody to say goodbye to
      client_->Close();
    } else if (client_) {
      client_->Send(LeaveMessage(reason));
      client_->Close();
    }
    work_.reset();
  }

  std::string node_id() const override { return o_.node_id; }
  StragglerExchange* stragglers() override { return stragglers_.get(); }

  void AskStacks(const std::string& reason, std::chrono::milliseconds timeout,
                 std::function<void(RemoteStacks)> done) override {
    if (Ended() || !client_) {
      RemoteStacks none;
      none.missing.push_back("the other nodes (no session with the rendezvous service)");
      asio::post(io_, [done = std::move(done), none] { done(none); });
      return;
    }
    const std::uint64_t id = next_stacks_id_++;
    client_->Send(StacksWantedMessage(id, reason, timeout));
    // The service answers by `timeout`; a second more for the answer to travel, then without it.
    auto timer = std::make_shared<asio::steady_timer>(io_, timeout + std::chrono::seconds(1));
    stacks_waits_[id] = {std::move(done), timer};
    timer->async_wait([this, id](const boost::system::error_code& ec) {
      if (ec) return;
      RemoteStacks none;
      none.missing.push_back("the other nodes (no answer from the rendezvous service at " +
                             target_ + " in time)");
      AnswerStacks(id, std::move(none));
    });
  }

  void ReplyStacks(std::uint64_t id, const std::string& host, const std::vector<RankStacks>& ranks,
                   const std::string& error) override {
    if (Ended() || !client_) return;
    client_->Send(StacksReplyMessage(id, o_.node_id, host, ranks, error));
  }

 private:
  void AnswerStacks(std::uint64_t id, RemoteStacks stacks) {
    auto it = stacks_waits_.find(id);
    if (it == stacks_waits_.end()) return;
    auto wait = std::move(it->second);
    stacks_waits_.erase(it);
    wait.timer->cancel();
    wait.done(std::move(stacks));
  }

  // Where this agent stands with the service. Ended and left are final; the others move as
  // sessions open, fail and hear from the service.
  enum class State {
    kProbing,       // first contact: the endpoint has not answered on a session yet
    kRetrying,      // a session failed before the service said anything: trying again
    kInJob,         // the service has spoken on this session
    kReconnecting,  // lost a durable service: rejoining, within reconnect_timeout
    kBack,          // reconnecting, and the service has spoken again (its assignment follows)
    kEnded,         // finished, refused or given up: the agent is told, nothing else happens
    kLeft,          // Leave() ran
    kTelling,       // Leave() ran; a health report still waits for the endpoint (TellThenLeave)
  };
  bool Heard() const { return state_ == State::kInJob || state_ == State::kBack; }
  bool Reconnecting() const { return state_ == State::kReconnecting || state_ == State::kBack; }
  bool Ended() const {
    return state_ == State::kEnded || state_ == State::kLeft || state_ == State::kTelling;
  }

  // Every timer and the probe: nothing of this rendezvous runs after it.
  void StopTimers() {
    heartbeat_.cancel();
    join_timer_.cancel();
    reconnect_timer_.cancel();
    probe_timer_.cancel();
    boost::system::error_code ignored;
    probe_.close(ignored);
    // Stacks asked for and not come: answered now, without them.
    for (auto& [id, wait] : std::exchange(stacks_waits_, {})) {
      wait.timer->cancel();
      RemoteStacks none;
      none.missing.push_back("the other nodes (the session with the rendezvous service ended)");
      asio::post(io_, [done = std::move(wait.done), none] { done(none); });
    }
  }

  // Leave before any session opened, with a failed health check to report: the probe goes on
  // until the endpoint listens, for up to join_timeout and kTellLimit at most, so that the
  // service counts and names the node even when its check failed before the host node's crun
  // was listening. No events follow; the agent's event loop ends once this does.
  void TellThenLeave(const std::string& reason) {
    static constexpr std::chrono::milliseconds kTellLimit{10'000};
    state_ = State::kTelling;
    farewell_ = reason;
    heartbeat_.cancel();
    join_timer_.cancel();
    const auto limit = std::min(o_.settings.join_timeout, kTellLimit);
    reconnect_timer_.expires_after(limit);
    reconnect_timer_.async_wait([this, limit](const boost::system::error_code& ec) {
      if (ec || state_ != State::kTelling) return;
      spdlog::warn(
          "could not tell the rendezvous service at {} that this node failed its health check: "
          "it did not listen within {} ms",
          target_, limit.count());
      state_ = State::kLeft;
      StopTimers();
      work_.reset();
    });
    if (probe_targets_.empty()) return;  // unresolved: nothing to probe; the limit ends it
    Probe();
  }

  // The endpoint listens: the health report and the goodbye on one session, written before
  // it closes.
  void Tell() {
    state_ = State::kLeft;
    StopTimers();
    CallOptions call;
    call.token = o_.security.token;
    call.wait_for_ready = false;
    client_ = std::make_unique<SessionClient>(
        *stub_, [](v1::ServiceMessage) {}, [](const Status&) {}, call);
    client_->Send(JoinMessage(*unhealthy_));
    client_->Send(LeaveMessage(farewell_));
    client_->Close();
    work_.reset();
  }

  // Until the endpoint accepts a TCP connection, retry after 5 ms, growing by half up to 1 s
  // (±20 % jitter, so that many agents spread out). gRPC's own reconnect backoff never waits
  // less than 100 ms, which agents started together with the host node would always pay.
  void Probe() {
    if (probing_) return;  // one chain of attempts at a time
    probing_ = true;
    ProbeAttempt();
  }

  void ProbeAttempt() {
    asio::async_connect(probe_, probe_targets_,
                        [this](const boost::system::error_code& ec,
                               const asio::ip::tcp::endpoint&) {
                          if (Ended() && state_ != State::kTelling) return;
                          boost::system::error_code ignored;
                          probe_.close(ignored);
                          if (!ec) {
                            probing_ = false;
                            return state_ == State::kTelling ? Tell() : OpenSession(true);
                          }
                          probe_timer_.expires_after(probe_backoff_.Next());
                          probe_timer_.async_wait([this](const boost::system::error_code& e) {
                            if (!e && (!Ended() || state_ == State::kTelling)) ProbeAttempt();
                          });
                        });
  }

  // `listening`: the endpoint accepted a TCP connection just now, so a session that cannot be
  // set up (TLS on one side only, not a crun service) fails at once instead of being retried.
  void OpenSession(bool listening) {
    listening_ = listening;
    join_sent_ = false;
    CallOptions call;
    call.token = o_.security.token;
    // Reconnecting, the channel may still be in its backoff from the outage: wait for it
    // (reconnect_timeout bounds the wait) rather than fail at once.
    // Retrying after a closed socket, fail fast again: three in a row tell a TLS mismatch.
    call.wait_for_ready =
        !listening || Reconnecting() || (state_ == State::kRetrying && closed_in_a_row_ == 0);
    opened_ = false;
    beats_.reset();  // a new session gets its own ticket
    const std::uint64_t session = ++sessions_;
    client_ = std::make_unique<SessionClient>(
        *stub_,
        [this](v1::ServiceMessage m) { asio::post(io_, [this, m = std::move(m)] { Handle(m); }); },
        [this](const Status& s) { asio::post(io_, [this, s] { OnSessionEnded(s); }); }, call,
        [this, session] {
          asio::post(io_, [this, session] {
            if (session == sessions_ && !Ended()) OnOpened();
          });
        });
    ArmHeartbeat();
    if (join_pending_) {
      join_pending_ = false;
      Join(ports_);
    }
  }

  void ArmHeartbeat() {
    heartbeat_.expires_after(o_.heartbeat_interval);
    heartbeat_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || Ended() || !client_) return;
      SendBeat(HeartbeatMessage(++sequence_, o_.snapshot_facts.get(), stragglers_.get()));
      ArmHeartbeat();
    });
  }

  // Heartbeats as datagrams on the service's ticket (UdpBeats), when it gave one; else, and
  // for the rest of the session once the socket failed, on the stream.
  void StartBeatsOverUdp() {
    if (!client_) return;
    const auto ticket = client_->beat_ticket();
    if (!ticket) {
      if (const auto why = client_->ticket_error(); !why.empty()) {
        spdlog::warn("{}: heartbeats go on the gRPC stream", why);
      }
      return;
    }
    auto socket = BeatSocket::Connect(client_->peer(), ticket->port);
    if (!socket.ok()) {
      spdlog::warn("{}: heartbeats go on the gRPC stream", socket.status().message());
      return;
    }
    beats_.emplace(*ticket, std::move(socket).value(),
                   AckWatch(o_.heartbeat_interval, o_.settings.heartbeat_timeout,
                            std::chrono::steady_clock::now()));
  }

  void SendBeat(v1::AgentMessage m) {
    if (beats_) {
      const auto sent = beats_->Send(m.heartbeat(), std::chrono::steady_clock::now());
      if (sent == UdpBeats::Sent::kDatagram) return;
      if (sent == UdpBeats::Sent::kFailed) beats_.reset();
    }
    client_->Send(std::move(m));
  }

  // The service's slow-rank verdicts, for this node's round only.
  void OnStragglers(const v1::Stragglers& s) {
    auto& x = stragglers_;
    if (!x || !x->on_verdicts || s.round() != x->round) return;
    x->on_verdicts(VerdictsFromProto(s));
  }

  void Handle(const v1::ServiceMessage& m) {
    if (Ended()) return;
    state_ = Reconnecting() ? State::kBack : State::kInJob;
    switch (m.kind_case()) {
      case v1::ServiceMessage::kAssignment: {
        const auto& a = m.assignment();
        const GroupAssignment g =
            AssignmentFromProto(a, {o_.run_id, o_.role, o_.node_id, o_.nproc,
                                    o_.settings.max_restarts, o_.virtual_local_rank});
        durable_ = a.durable_service();
        // A service that judges slow ranks gets this node's figures; else the node judges alone.
        if (stragglers_) stragglers_->job_wide = a.judges_stragglers();
        state_ = State::kInJob;
        reconnect_timer_.cancel();
        return events_->OnAssignment(g);
      }
      case v1::ServiceMessage::kStopAndRejoin:
        return events_->OnStopAndRejoin(StopFromProto(m.stop_and_rejoin()));
      case v1::ServiceMessage::kFinished: {
        const JobOutcome o = OutcomeFromProto(m.finished());
        state_ = State::kEnded;
        StopTimers();
        return events_->OnFinished(o);
      }
      case v1::ServiceMessage::kStacksRequest:
        return events_->OnStacksRequest(m.stacks_request().request_id(),
                                        m.stacks_request().reason());
      case v1::ServiceMessage::kStacksResult:
        return AnswerStacks(m.stacks_result().request_id(),
                            RemoteStacksFromProto(m.stacks_result()));
      case v1::ServiceMessage::kStragglers:
        return OnStragglers(m.stragglers());
      case v1::ServiceMessage::kRefused:
        return End(1, RefusedMessage(o_, target_, m.refused().reason()));
      case v1::ServiceMessage::KIND_NOT_SET:
        return;
    }
  }

  void OnSessionEnded(const Status& s) {
    if (Ended()) return;
    if (s.code() == StatusCode::kPermissionDenied) {
      return End(1, RefusedMessage(o_, target_, s.message()) +
                        (o_.security.token.empty()
                             ? ""
                             : " (this node's token is from " + o_.security.token_source + ")"));
    }
    const std::string why = s.ok() ? std::string("it ended the session") : s.message();
    if (durable_ && (Heard() || Reconnecting())) return Reconnect(why);
    if (!Heard() && opened_) return LostWhileGathering(why);
    if (!Heard() && listening_ && !s.ok() && !IsMismatch(s.message())) {
      // Not a word from the service yet, and nothing says it is the wrong kind of service: it
      // is busy, stopped or restarting, or gone while the job gathers. Try again, as long as
      // join_timeout allows (the join timer ends it), the join resent on the next session.
      return RetrySession(s.message());
    }
    if (!Heard() && listening_ && !s.ok()) {
      // The port is open, and what answered is not a crun service this node can talk to.
      return End(1, "cannot open a session with the rendezvous service at " + target_ + ": " +
                        s.message() + SetupHint(o_));
    }
    End(1, "lost the rendezvous service at " + target_ + ": " + why);
  }

  // Whether a session error shows the other side is not a crun service this node can talk
  // to: TLS on one side only, a certificate refused, an HTTP/1 server. A closed socket is
  // what a TLS service does to a plaintext client, but also what a restarting service does:
  // it counts only when it happens three times in a row.
  bool IsMismatch(const std::string& error) {
    if (MismatchSign(error)) return true;
    if (error.find("Socket closed") == std::string::npos) {
      closed_in_a_row_ = 0;
      return false;
    }
    return ++closed_in_a_row_ >= 3;
  }

  void EndUnreachable() {
    End(1, "cannot reach the rendezvous service at " + target_ + " within " +
               std::to_string(o_.settings.join_timeout.count()) +
               " ms (join_timeout): " + UnreachableHint(o_) +
               (last_error_.empty() ? std::string() : " Last error: " + last_error_));
  }

  void RetrySession(const std::string& why) {
    if (join_deadline_passed_) {
      last_error_ = why;
      if (gathering_lost_) return End(1, lost_ + ", and join_timeout has passed");
      return EndUnreachable();
    }
    if (state_ != State::kRetrying) {
      spdlog::info("no session with {} yet ({}): retrying", target_, why);
    }
    state_ = State::kRetrying;
    last_error_ = why;
    retired_.push_back(std::move(client_));  // ended; destroyed with this rendezvous
    heartbeat_.cancel();
    if (join_sent_) join_pending_ = true;
    probe_backoff_.Reset();
    Probe();
  }

  // The daemon went away mid-job (a restart, an upgrade): stop the workers (their store went
  // with it) and rejoin once it answers again; give up after reconnect_timeout.
  void Reconnect(const std::string& why) {
    retired_.push_back(std::move(client_));  // ended; destroyed with this rendezvous
    heartbeat_.cancel();
    probe_backoff_.Reset();
    if (Reconnecting()) {
      // A try that failed: again, within the same deadline (the timer is armed again if the
      // service had spoken: it may have passed meanwhile). A join it carried is sent again on
      // the next session (the workers are down and the agent waits for an assignment).
      if (state_ == State::kBack) ArmReconnectDeadline();
      state_ = State::kReconnecting;
      if (join_sent_) join_pending_ = true;
      return Probe();
    }
    state_ = State::kReconnecting;
    lost_ = "lost the rendezvous service at " + target_ + " (" + why + ")";
    spdlog::warn(
        "{}: it is a daemon, so this node stops its workers and rejoins when it is "
        "back (for up to {} ms, reconnect_timeout)",
        lost_, o_.reconnect_timeout.count());
    reconnect_deadline_ = std::chrono::steady_clock::now() + o_.reconnect_timeout;
    ArmReconnectDeadline();
    Probe();
    events_->OnStopAndRejoin({lost_ + "; rejoining when it is back", false, "", {}});
  }

  // The service opened this session (before it said anything: the round is gathering).
  void OnOpened() {
    opened_ = true;
    StartBeatsOverUdp();
    if (!gathering_lost_) return;
    gathering_lost_ = false;  // back: a later loss has reconnect_timeout again
    reconnect_timer_.cancel();
    spdlog::info("the rendezvous service at {} is back: joining again", target_);
  }

  // A session that was open ended while the round gathered: the same event as a service lost
  // in any other phase (docs/rendezvous.md), so reconnect_timeout bounds how long this node
  // tries to open one again, the join sent again on it; join_timeout is for a service never
  // reached.
  void LostWhileGathering(const std::string& why) {
    if (!gathering_lost_) {
      gathering_lost_ = true;
      lost_ = "lost the rendezvous service at " + target_ + " (" + why +
              ") while the round was gathering";
      spdlog::warn("{}: joining again when it is back (for up to {} ms, reconnect_timeout)", lost_,
                   o_.reconnect_timeout.count());
      reconnect_timer_.expires_after(o_.reconnect_timeout);
      reconnect_timer_.async_wait([this](const boost::system::error_code& ec) {
        if (ec || Ended() || !gathering_lost_) return;
        End(1, lost_ + " and it was not back within " +
                   std::to_string(o_.reconnect_timeout.count()) + " ms (reconnect_timeout)");
      });
    }
    RetrySession(why);
  }

  void ArmReconnectDeadline() {
    reconnect_timer_.expires_at(reconnect_deadline_);
    reconnect_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || state_ != State::kReconnecting) return;
      End(1, lost_ + " and it was not back within " + std::to_string(o_.reconnect_timeout.count()) +
                 " ms (reconnect_timeout)");
    });
  }

  void End(int code, const std::string& reason) {
    if (Reconnecting() && client_) {
      client_->Cancel();  // a session still waiting for the service: nobody to say goodbye to
      client_->Close();
      retired_.push_back(std::move(client_));
    }
    state_ = State::kEnded;
    StopTimers();
    spdlog::error("{}", reason);
    JobOutcome o;
    o.exit_code = code;
    o.reason = reason;
    events_->OnFinished(o);
  }

  asio::io_context& io_;
  ServiceRendezvousOptions o_;
  // Slow ranks judged job-wide: shared with posts that may outlive a call.
  std::shared_ptr<StragglerExchange> stragglers_ = std::make_shared<StragglerExchange>();
  asio::steady_timer heartbeat_;
  asio::steady_timer join_timer_;
  asio::steady_timer reconnect_timer_;
  asio::ip::tcp::socket probe_;
  asio::steady_timer probe_timer_;
  asio::ip::tcp::resolver::results_type probe_targets_;
  Backoff probe_backoff_;
  std::uint64_t incarnation_;  // this agent's, in every join (a node id taken over on return)
  bool join_pending_ = false;
  bool join_sent_ = false;         // on the current session
  bool probing_ = false;           // a probe connect is in flight
  std::optional<UdpBeats> beats_;  // heartbeats over UDP on the current session
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::string target_;
  std::string goodput_;  // this node's ledger as last shared (ShareGoodput)
  RendezvousEvents* events_ = nullptr;
  struct StacksWait {
    std::function<void(RemoteStacks)> done;
    std::shared_ptr<asio::steady_timer> timer;
  };
  std::map<std::uint64_t, StacksWait> stacks_waits_;  // AskStacks calls not answered yet
  std::uint64_t next_stacks_id_ = 1;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::vector<std::unique_ptr<SessionClient>> retired_;  // sessions that ended (reconnects)
  std::unique_ptr<SessionClient> client_;
  std::uint64_t sequence_ = 0;
  std::vector<std::uint16_t> ports_;  // this node's, sent with every join
  bool durable_ = false;  // the service said it outlives jobs (RoundAssignment.durable_service)
  bool listening_ = false;
  bool opened_ = false;          // the service opened the current session (OnOpened)
  bool gathering_lost_ = false;  // lost an open session while gathering: reconnect_timer_ runs
  std::uint64_t sessions_ = 0;   // sessions opened: a stale session's OnOpened is ignored
  bool join_deadline_passed_ = false;
  int closed_in_a_row_ = 0;  // sessions that ended with "Socket closed" (IsMismatch)
  std::string last_error_;   // of the last session that failed, for the final message
  State state_ = State::kProbing;
  std::chrono::steady_clock::time_point reconnect_deadline_;
  std::string lost_;                      // what was lost, for the reconnect deadline's message
  std::optional<std::string> unhealthy_;  // a health report made before any session opened
  std::string farewell_;                  // Leave's reason, said after it (TellThenLeave)
};

}  // namespace

std::unique_ptr<Rendezvous> MakeServiceRendezvous(asio::io_context& io,
                                                  const ServiceRendezvousOptions& options) {
  return std::make_unique<ServiceRendezvous>(io, options);
}

}  // namespace crun::agent
