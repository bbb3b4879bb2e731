// The agent's end of heartbeats over UDP (rendezvous/beats/beat_datagram.h): a socket connected
// to the service's beat port on the address the session's stream reached, so that a refused
// port (ICMP) comes back as an error on a later send and the agent goes back to beating on
// its stream. One socket may carry the beats of many sessions (the load generator's agents).
//
// The service acks each beat it takes; AckWatch says from those acks when a beat must go on
// the stream too, so that the service hears this node within heartbeat_timeout whatever
// happens to the datagrams.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "crun/v1/rendezvous.pb.h"
#include "rendezvous/beats/beat_datagram.h"

namespace crun::agent {

class BeatSocket {
 public:
  // `ip`: the service's address as gRPC's peer names it ("ipv4:10.0.0.1:29400" or plain).
  static StatusOr<BeatSocket> Connect(const std::string& ip, std::uint16_t port);
  BeatSocket(BeatSocket&& other) noexcept;
  BeatSocket& operator=(BeatSocket&& other) noexcept;
  BeatSocket(const BeatSocket&) = delete;
  BeatSocket& operator=(const BeatSocket&) = delete;
  ~BeatSocket();

  // Sends `beat` sealed under `ticket`, never blocking. An error when it cannot go as a
  // datagram: too large (send it on the stream), or the socket failed (the port refused, no
  // route, a full buffer): the message names the address.
  Status Send(const rdzv::BeatTicket& ticket, const v1::Heartbeat& beat);
  // Reads what has come: `each` gets every datagram, to open as an ack. Waits up to `wait` for
  // the first (none: never blocks). Returns how many were read. A socket error read here (the
  // port refused an earlier beat) is the next Send's.
  std::size_t Receive(const std::function<void(std::string_view datagram)>& each,
                      std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  const std::string& target() const { return target_; }

 private:
  BeatSocket(int fd, std::string target) : fd_(fd), target_(std::move(target)) {}
  int fd_ = -1;
  int error_ = 0;       // read by Receive, said by the next Send
  std::string target_;  // "udp 10.0.0.1:29400", for messages
};

// When a session's beats must go on its stream too (pure: events in, time injected). The
// service drops a node it has not heard for heartbeat_timeout. The newest ack says when the
// service last heard this node: the send time of the beat it answers (at first, the session's
// opening). A beat goes on the stream too when, by that, the next beat would come too late:
// the time since then, plus one interval and half an interval's slack, reaches the timeout.
// With the defaults (1 s, 3 s) one beat unanswered sends the next on the stream; a longer
// timeout tolerates more. One late or lost ack costs one stream beat, nothing more.
class AckWatch {
 public:
  using Clock = std::chrono::steady_clock;
  AckWatch(std::chrono::milliseconds interval, std::chrono::milliseconds timeout,
           Clock::time_point opened);
  // A beat sent as a datagram.
  void Sent(std::uint64_t sequence, Clock::time_point at);
  // The service's ack of `sequence` (one this watch did not send, or too old to remember, is
  // ignored).
  void Acked(std::uint64_t sequence);
  // Whether the beat due at `now` must go on the stream too.
  bool StreamToo(Clock::time_point now) const;
  // Some beat was acked.
  bool heard() const { return heard_; }

 private:
  std::chrono::milliseconds interval_, timeout_;
  Clock::time_point heard_at_;  // the send time of the newest beat acked, or the opening
  bool heard_ = false;
  std::uint64_t newest_acked_ = 0;
  // The last beats sent (sequence, time), oldest overwritten.
  std::array<std::pair<std::uint64_t, Clock::time_point>, 8> sent_{};
  std::size_t next_ = 0;
};

// A session's heartbeats as datagrams, on the ticket its service gave (rendezvous/beats): each
// goes to the address the stream reached, and the service acks each one it takes. A beat goes on
// the stream too when the acks say the service may not have heard this node for long enough
// (AckWatch), the datagram then without its figures (judged once). The log says when the
// service begins or stops answering.
class UdpBeats {
 public:
  UdpBeats(rdzv::BeatTicket ticket, BeatSocket socket, AckWatch watch)
      : ticket_(std::move(ticket)), socket_(std::move(socket)), watch_(std::move(watch)) {}

  enum class Sent {
    kDatagram,   // that is all it needs
    kStreamToo,  // send it on the stream too (unanswered lately, or too large for a datagram)
    kFailed,     // the socket failed: this beat and the rest of the session's go on the stream
  };
  Sent Send(const v1::Heartbeat& beat, AckWatch::Clock::time_point now);

 private:
  void TakeAcks(AckWatch::Clock::time_point now);

  rdzv::BeatTicket ticket_;
  BeatSocket socket_;
  AckWatch watch_;
  bool streaming_ = false;  // the last beat went on the stream too
};

}  // namespace crun::agent
