#include "agent/rendezvous/beat_sender.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/endpoint.h"
#include "base/security.h"

namespace crun::agent {

StatusOr<BeatSocket> BeatSocket::Connect(const std::string& ip, std::uint16_t port) {
  const std::string host = PeerIp(ip);
  const std::string target = "udp " + FormatEndpoint(host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      rc != 0) {
    return InvalidArgument("heartbeats over " + target + ": " + gai_strerror(rc));
  }
  const int fd = socket(found->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int err = fd < 0 || connect(fd, found->ai_addr, found->ai_addrlen) != 0 ? errno : 0;
  freeaddrinfo(found);
  if (err != 0) {
    if (fd >= 0) close(fd);
    return Unavailable("heartbeats over " + target + ": " + std::strerror(err));
  }
  return BeatSocket(fd, target);
}

BeatSocket::BeatSocket(BeatSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), target_(std::move(other.target_)) {}

BeatSocket& BeatSocket::operator=(BeatSocket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    target_ = std::move(other.target_);
  }
  return *this;
}

BeatSocket::~BeatSocket() {
  if (fd_ >= 0) close(fd_);
}

Status BeatSocket::Send(const rdzv::BeatTicket& ticket, const v1::Heartbeat& beat) {
  const std::string payload = beat.SerializeAsString();
  if (payload.size() > rdzv::kMaxBeatPayload) {
    return InvalidArgument("a heartbeat of " + std::to_string(payload.size()) +
                           " bytes does not fit a datagram");
  }
  const std::string d = rdzv::SealBeat(ticket, payload);
  if (send(fd_, d.data(), d.size(), MSG_NOSIGNAL) < 0) {
    return Unavailable("heartbeats over " + target_ + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace crun::agent
