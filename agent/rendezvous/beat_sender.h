// The agent's end of heartbeats over UDP (rendezvous/beats/beat_datagram.h): a socket connected
// to the service's beat port on the address the session's stream reached, so that a refused
// port (ICMP) comes back as an error on a later send and the agent goes back to beating on
// its stream. One socket may carry the beats of many sessions (the load generator's agents).
#pragma once

#include <cstdint>
#include <string>

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
  const std::string& target() const { return target_; }

 private:
  BeatSocket(int fd, std::string target) : fd_(fd), target_(std::move(target)) {}
  int fd_ = -1;
  std::string target_;  // "udp 10.0.0.1:29400", for messages
};

}  // namespace crun::agent
