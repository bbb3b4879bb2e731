#include "agent/rendezvous/beat_sender.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "base/endpoint.h"
#include "base/security.h"
#include "base/socket.h"

namespace crun::agent {

StatusOr<BeatSocket> BeatSocket::Connect(const std::string& ip, std::uint16_t port) {
  const std::string host = PeerIp(ip);
  auto fd = ConnectUdp(host, port);
  if (!fd.ok()) {
    return Status(fd.status().code(), "heartbeats over " + fd.status().message());
  }
  return BeatSocket(fd->release(), "udp " + FormatEndpoint(host, port));
}

BeatSocket::BeatSocket(BeatSocket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), error_(other.error_), target_(std::move(other.target_)) {}

BeatSocket& BeatSocket::operator=(BeatSocket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    error_ = other.error_;
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
  if (const int err = std::exchange(error_, 0); err != 0) {
    return Unavailable("heartbeats over " + target_ + ": " + std::strerror(err));
  }
  if (send(fd_, d.data(), d.size(), MSG_NOSIGNAL) < 0) {
    return Unavailable("heartbeats over " + target_ + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

std::size_t BeatSocket::Receive(const std::function<void(std::string_view datagram)>& each,
                                std::chrono::milliseconds wait) {
  std::array<char, rdzv::kBeatAckSize + 1> buffer{};  // +1: a longer datagram shows
  std::size_t read = 0;
  if (wait.count() > 0) {
    pollfd p{fd_, POLLIN, 0};
    (void)poll(&p, 1, static_cast<int>(wait.count()));
  }
  while (true) {
    const ssize_t n = recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      // ECONNREFUSED: the port refused a beat (ICMP); Send says so next. Else drained.
      if (errno != EAGAIN && errno != EWOULDBLOCK) error_ = errno;
      return read;
    }
    ++read;
    each(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
  }
}

AckWatch::AckWatch(std::chrono::milliseconds interval, std::chrono::milliseconds timeout,
                   Clock::time_point opened)
    : interval_(interval), timeout_(timeout), heard_at_(opened) {}

void AckWatch::Sent(std::uint64_t sequence, Clock::time_point at) {
  sent_[next_] = {sequence, at};
  next_ = (next_ + 1) % sent_.size();
}

void AckWatch::Acked(std::uint64_t sequence) {
  if (sequence <= newest_acked_) return;
  for (const auto& [s, at] : sent_) {
    if (s == sequence && s != 0) {
      newest_acked_ = sequence;
      heard_at_ = std::max(heard_at_, at);
      heard_ = true;
      return;
    }
  }
}

bool AckWatch::StreamToo(Clock::time_point now) const {
  return now - heard_at_ + interval_ + interval_ / 2 >= timeout_;
}

// The acks that came since the last beat; says when the service began or stopped answering.
void UdpBeats::TakeAcks(AckWatch::Clock::time_point now) {
  const bool was_heard = watch_.heard();
  socket_.Receive([this](std::string_view d) {
    if (const auto ack = rdzv::OpenAck(ticket_.key, d); ack && ack->session == ticket_.session) {
      watch_.Acked(ack->sequence);
    }
  });
  const bool streaming = watch_.StreamToo(now);
  if (!was_heard && watch_.heard()) {
    spdlog::info("heartbeats over {}: the service hears them, the gRPC stream carries none",
                 socket_.target());
  } else if (watch_.heard() && streaming != streaming_) {
    if (streaming) {
      spdlog::warn(
          "heartbeats over {}: the service has not answered lately; beats go on the gRPC stream "
          "too until it does",
          socket_.target());
    } else {
      spdlog::info("heartbeats over {}: the service answers again, the gRPC stream carries none",
                   socket_.target());
    }
  }
  streaming_ = streaming;
}

UdpBeats::Sent UdpBeats::Send(const v1::Heartbeat& beat, AckWatch::Clock::time_point now) {
  TakeAcks(now);
  v1::Heartbeat datagram = beat;
  if (streaming_) datagram.clear_compute();
  const Status sent = socket_.Send(ticket_, datagram);
  if (sent.ok()) {
    watch_.Sent(datagram.sequence(), now);
    return streaming_ ? Sent::kStreamToo : Sent::kDatagram;
  }
  if (sent.code() == StatusCode::kInvalidArgument) return Sent::kStreamToo;  // too large
  spdlog::warn("{}: heartbeats go on the gRPC stream for the rest of this session", sent.message());
  return Sent::kFailed;
}

}  // namespace crun::agent
