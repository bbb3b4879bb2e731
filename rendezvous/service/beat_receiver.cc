#include "rendezvous/service/beat_receiver.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

namespace crun::rdzv {
namespace {

namespace asio = boost::asio;
constexpr int kBatch = 64;
// Room for the datagrams of one gap: 100,000 agents beating each second send 2,000 in 20 ms,
// about 1.5 MiB as the kernel counts them. SO_RCVBUFFORCE goes past net.core.rmem_max when the
// daemon may (CAP_NET_ADMIN); else the kernel's cap holds and a burst beyond it is dropped.
constexpr int kReceiveBuffer = 8 << 20;

}  // namespace

BeatReceiver::BeatReceiver(asio::io_context& engine, std::chrono::milliseconds gap)
    : engine_(engine), gap_timer_(io_), gap_(gap) {}

BeatReceiver::~BeatReceiver() { Stop(); }

StatusOr<std::unique_ptr<BeatReceiver>> BeatReceiver::Open(asio::io_context& engine,
                                                           const std::string& host,
                                                           std::uint16_t port,
                                                           std::chrono::milliseconds gap) {
  auto fds = BindUdp(host, port);
  if (!fds.ok()) {
    return Status(fds.status().code(), "heartbeats over UDP: " + fds.status().message());
  }
  std::unique_ptr<BeatReceiver> r(new BeatReceiver(engine, gap));
  r->fds_ = std::move(fds).value();
  for (const auto& fd : r->fds_) {
    if (setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &kReceiveBuffer, sizeof kReceiveBuffer) !=
        0) {
      (void)setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &kReceiveBuffer, sizeof kReceiveBuffer);
    }
    // Each datagram read carries the socket's count of those the kernel dropped (a full
    // receive buffer): counts_.dropped.
    const int on = 1;
    (void)setsockopt(fd.get(), SOL_SOCKET, SO_RXQ_OVFL, &on, sizeof on);
  }
  r->dropped_seen_.assign(r->fds_.size(), 0);
  r->port_ = LocalPort(r->fds_.front().get());
  return r;
}

void BeatReceiver::Start(BeatHandler beat, std::function<void()> before,
                         std::function<void()> after) {
  beat_ = std::move(beat);
  before_ = std::move(before);
  after_ = std::move(after);
  {
    std::lock_guard lock(mu_);
    started_ = true;
    if (!sessions_.empty() && !polling_) {
      polling_ = true;
      asio::post(io_, [this] { Poll(); });
    }
  }
  thread_ = std::thread([this] {
    auto work = asio::make_work_guard(io_);
    io_.run();
  });
}

void BeatReceiver::Stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

BeatKey BeatReceiver::Add(std::uint64_t session) {
  const BeatKey key = NewBeatKey();
  std::lock_guard lock(mu_);
  sessions_[session] = Entry{key, 0};
  if (started_ && !stopped_ && !polling_) {
    polling_ = true;
    asio::post(io_, [this] { Poll(); });
  }
  return key;
}

void BeatReceiver::Remove(std::uint64_t session) {
  std::lock_guard lock(mu_);
  sessions_.erase(session);
}

void BeatReceiver::NoteDrops(std::size_t index, const msghdr& h) {
  for (const cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(&h), const_cast<cmsghdr*>(c))) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SO_RXQ_OVFL) continue;
    std::uint32_t total = 0;  // since the socket opened; it wraps at 2^32
    std::memcpy(&total, CMSG_DATA(c), sizeof total);
    counts_.dropped.fetch_add(total - dropped_seen_[index], std::memory_order_relaxed);
    dropped_seen_[index] = total;
  }
}

void BeatReceiver::Poll() {
  for (std::size_t i = 0; i < fds_.size(); ++i) Drain(i);
  {
    std::lock_guard lock(mu_);
    // No session left: no more wake-ups until one is added (its datagrams wait in the socket).
    if (stopped_ || sessions_.empty()) {
      polling_ = false;
      return;
    }
  }
  gap_timer_.expires_after(gap_);
  gap_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) {
      std::lock_guard lock(mu_);
      polling_ = false;
      return;
    }
    Poll();
  });
}

// One batch's room: the datagrams received, their senders, and the acks sealed for them.
struct BeatReceiver::Batch {
  static constexpr std::size_t kSize = kMaxBeatPayload + kBeatOverhead + 1;  // +1: oversize shows
  // Room for SO_RXQ_OVFL's count on each datagram.
  using Control = std::array<char, CMSG_SPACE(sizeof(std::uint32_t))>;
  // An ack of the batch: sealed outside the lock with a copy of the key.
  struct Ack {
    BeatKey key;
    std::uint64_t session = 0, sequence = 0;
    std::size_t from = 0;
  };
  std::vector<std::array<char, kSize>> buffers = std::vector<std::array<char, kSize>>(kBatch);
  std::array<iovec, kBatch> iov{};
  std::array<sockaddr_storage, kBatch> from{};
  std::array<mmsghdr, kBatch> headers{};
  std::array<Control, kBatch> control{};
  std::array<Ack, kBatch> acks{};
  std::array<BeatAckDatagram, kBatch> sealed{};
  std::array<iovec, kBatch> ack_iov{};
  std::array<mmsghdr, kBatch> ack_headers{};

  // Up to kBatch datagrams waiting on `fd`; how many (0: none waits).
  int Receive(int fd) {
    for (std::size_t i = 0; i < kBatch; ++i) {
      iov[i] = {buffers[i].data(), kSize};
      headers[i] = {};
      headers[i].msg_hdr.msg_iov = &iov[i];
      headers[i].msg_hdr.msg_iovlen = 1;
      headers[i].msg_hdr.msg_name = &from[i];
      headers[i].msg_hdr.msg_namelen = sizeof from[i];
      headers[i].msg_hdr.msg_control = control[i].data();
      headers[i].msg_hdr.msg_controllen = control[i].size();
    }
    return std::max(recvmmsg(fd, headers.data(), kBatch, MSG_DONTWAIT, nullptr), 0);
  }

  // The first `acked` acks, sealed and addressed to their senders.
  void SealAcks(std::size_t acked) {
    for (std::size_t k = 0; k < acked; ++k) {
      const auto& a = acks[k];
      sealed[k] = SealAck(a.key, a.session, a.sequence);
      ack_iov[k] = {sealed[k].data(), sealed[k].size()};
      ack_headers[k] = {};
      ack_headers[k].msg_hdr.msg_iov = &ack_iov[k];
      ack_headers[k].msg_hdr.msg_iovlen = 1;
      ack_headers[k].msg_hdr.msg_name = &from[a.from];
      ack_headers[k].msg_hdr.msg_namelen = headers[a.from].msg_hdr.msg_namelen;
    }
  }
};

struct BeatReceiver::Taken {
  std::uint64_t session = 0;
  v1::Heartbeat beat;
};

void BeatReceiver::Drain(std::size_t index) {
  const int fd = fds_[index].get();
  static thread_local Batch batch;
  auto taken = std::make_shared<std::vector<Taken>>();
  while (true) {
    const int n = batch.Receive(fd);
    if (n == 0) break;  // EAGAIN: drained
    NoteDrops(index, batch.headers[static_cast<std::size_t>(n - 1)].msg_hdr);
    const std::size_t acked = Take(batch, static_cast<std::size_t>(n), *taken);
    batch.SealAcks(acked);
    SendAcks(fd, batch, acked);
    if (n < kBatch) break;
  }
  if (taken->empty()) return;
  // One post a drain: the engine wakes once for every beat of the gap.
  asio::post(engine_, [this, taken] {
    if (before_) before_();
    for (const auto& t : *taken) beat_(t.session, t.beat);
    if (after_) after_();
  });
}

std::size_t BeatReceiver::Take(Batch& b, std::size_t n, std::vector<Taken>& taken) {
  std::size_t acked = 0;
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& h = b.headers[i];
    const std::string_view datagram(b.buffers[i].data(), h.msg_len);
    const auto session = (h.msg_hdr.msg_flags & MSG_TRUNC) != 0 || datagram.size() >= Batch::kSize
                             ? std::nullopt
                             : BeatSession(datagram);
    if (!session) {
      counts_.malformed.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const auto it = sessions_.find(*session);
    if (it == sessions_.end()) {
      counts_.unknown.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const auto payload = OpenBeat(it->second.key, datagram);
    if (!payload) {
      counts_.forged.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    auto& t = taken.emplace_back();
    if (!t.beat.ParseFromArray(payload->data(), static_cast<int>(payload->size()))) {
      taken.pop_back();
      counts_.malformed.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (t.beat.sequence() <= it->second.last_sequence) {
      taken.pop_back();
      counts_.stale.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    it->second.last_sequence = t.beat.sequence();
    t.session = *session;
    b.acks[acked++] = Batch::Ack{it->second.key, *session, t.beat.sequence(), i};
    counts_.taken.fetch_add(1, std::memory_order_relaxed);
  }
  return acked;
}

// An ack that does not go (a full send buffer, an agent gone) is not retried: the agent counts
// it as unanswered and, after a few, beats on its stream too.
void BeatReceiver::SendAcks(int fd, Batch& b, std::size_t acked) {
  for (std::size_t sent = 0; sent < acked;) {
    const int m = sendmmsg(fd, b.ack_headers.data() + sent, static_cast<unsigned>(acked - sent),
                           MSG_DONTWAIT);
    if (m <= 0) {
      if (m < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        // One address refused (ICMP on a previous ack, or none to route to): skip it.
        counts_.acks_unsent.fetch_add(1, std::memory_order_relaxed);
        ++sent;
        continue;
      }
      counts_.acks_unsent.fetch_add(acked - sent, std::memory_order_relaxed);
      break;
    }
    sent += static_cast<std::size_t>(m);
  }
}

}  // namespace crun::rdzv
