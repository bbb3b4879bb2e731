#include "agent/snapshots/replicas.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <new>
#include <set>
#include <sstream>

#include <boost/algorithm/hex.hpp>
#include <crun/worker/snapshot_layout.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <spdlog/spdlog.h>

#include "agent/snapshots/node_snapshots.h"
#include "agent/snapshots/peer_link.h"
#include "base/endpoint.h"
#include "base/numbers.h"
#include "base/security.h"
#include "rendezvous/store/tcp_store_client.h"

#include "agent/snapshots/replica_wire.h"

namespace crun::agent {
namespace {

using namespace replica_wire;  // the protocol's own pieces

std::string Hex(const unsigned char* data, std::size_t n) {
  std::string out;
  boost::algorithm::hex_lower(data, data + n, std::back_inserter(out));
  return out;
}

std::string Nonce() {
  unsigned char b[16] = {};
  std::size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
  }
  return Hex(b, sizeof b);
}

// Whether `bytes` is a whole sealed snapshot: its header, its payload, its checksum.
Status CheckCopy(const std::vector<unsigned char>& bytes) {
  if (bytes.size() < snap::kHeaderBytes) return InvalidArgument("a copy shorter than its header");
  snap::BufferHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (!snap::HasMagic(h) || h.state != snap::kComplete) {
    return InvalidArgument("a copy that is not a complete crun snapshot");
  }
  if (h.payload_bytes != bytes.size() - snap::kHeaderBytes ||
      h.checksum_generation != h.generation ||
      SnapshotChecksum(h, bytes.data() + snap::kHeaderBytes, h.payload_bytes) != h.checksum) {
    return InvalidArgument("the copy of rank " + std::to_string(h.rank) + " at step " +
                           std::to_string(h.step) + " fails its checksum");
  }
  return Status::Ok();
}

}  // namespace

std::string ReplicaProof(const std::string& token, const std::string& challenge) {
  if (token.empty()) return "-";
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(challenge.data()), challenge.size(), mac, &len);
  return Hex(mac, len);
}

StatusOr<std::unique_ptr<Replicas>> Replicas::Listen(std::string token,
                                                     std::shared_ptr<PeerTls> tls) {
  UniqueFd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return PosixError("the snapshot replica server's socket", errno);
  int off = 0, on = 1;
  ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in6 any{};
  any.sin6_family = AF_INET6;
  any.sin6_addr = in6addr_any;
  socklen_t len = sizeof any;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&any), sizeof any) != 0 ||
      ::listen(fd.get(), 64) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&any), &len) != 0) {
    return PosixError("the snapshot replica server cannot listen", errno);
  }
  auto r = std::unique_ptr<Replicas>(
      new Replicas(std::move(fd), ntohs(any.sin6_port), std::move(token), std::move(tls)));
  if (::pipe2(r->wake_, O_CLOEXEC) != 0) return PosixError("the replica server's pipe", errno);
  r->acceptor_ = std::thread([raw = r.get()] { raw->AcceptLoop(); });
  return r;
}

Replicas::Replicas(UniqueFd listener, std::uint16_t port, std::string token,
                   std::shared_ptr<PeerTls> tls)
    : listener_(std::move(listener)), port_(port), token_(std::move(token)), tls_(std::move(tls)) {}

Replicas::~Replicas() {
  stopping_ = true;
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<Background> sessions;
  {
    std::lock_guard lock(mu_);
    for (int fd : session_fds_) ::shutdown(fd, SHUT_RDWR);
    sessions.swap(sessions_);
  }
  for (auto& l : sessions) l.thread.join();
  for (auto& l : discoveries_) l.thread.join();
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

void Replicas::Reap(std::vector<Background>& threads) {
  std::erase_if(threads, [](Background& b) {
    if (!*b.done) return false;
    b.thread.join();
    return true;
  });
}

void Replicas::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listener_.get(), POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno == EINTR) continue;
    if (stopping_ || (p[1].revents & POLLIN)) return;
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    const int fd =
        ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char host[NI_MAXHOST] = "?";
    ::getnameinfo(reinterpret_cast<sockaddr*>(&from), len, host, sizeof host, nullptr, 0,
                  NI_NUMERICHOST);
    std::string peer = host;
    if (peer.rfind("::ffff:", 0) == 0) peer = peer.substr(7);  // an IPv4 peer, as such
    std::lock_guard lock(mu_);
    Reap(sessions_);
    session_fds_.push_back(fd);
    auto done = std::make_shared<std::atomic<bool>>(false);
    sessions_.push_back({std::thread([this, fd, done, peer] {
                           Serve(fd, peer);
                           *done = true;
                         }),
                         done});
  }
}

void Replicas::Serve(int fd, std::string peer) {
  PeerLink link{UniqueFd(fd)};
  const auto close = [&] {
    std::lock_guard lock(mu_);
    session_fds_.erase(std::find(session_fds_.begin(), session_fds_.end(), fd));
    link.reset();
  };
  const auto refuse = [&](std::string_view why) {
    {
      std::lock_guard lock(mu_);
      ++counters_.refused;
    }
    spdlog::warn("crun: refused a snapshot replication connection from {}: {}", peer, why);
  };
  if (Status tls = link.Handshake(tls_, true, In(kDial), peer); !tls.ok()) {
    refuse("no TLS session (" + tls.message() + "): this job's copies travel over TLS only");
    return close();
  }
  const std::string nonce = Nonce();
  auto auth = link.Send("crun-replica 1 " + nonce + "\n", In(kDial), peer).ok()
                  ? ReadLine(link, In(kDial), peer)
                  : StatusOr<std::string>(Unavailable("gone"));
  if (!auth.ok() || auth->rfind("auth ", 0) != 0 ||
      (!token_.empty() && !TokenMatches(Proof(token_, link, nonce), auth->substr(5)))) {
    refuse("it did not prove the job's token");
    (void)link.Send("error refused: not this job's token\n", In(kDial), peer);
    return close();
  }
  Status s = link.Send("ok\n", In(kDial), peer);
  while (s.ok() && !stopping_) {
    auto line = ReadLine(link, In(seconds(24 * 3600)), peer);
    if (!line.ok()) break;
    const auto w = Words(*line);
    const auto a = w.size() >= 2 ? ParseInteger(w[1], 0, INT64_MAX) : std::nullopt;
    const auto b = w.size() == 3 ? ParseInteger(w[2], 0, INT64_MAX) : std::nullopt;
    if (w.size() == 2 && w[0] == "put" && a) {
      bool consumed = false;  // whether the copy's bytes were all read
      const Status put = Put(link, static_cast<std::uint64_t>(*a), peer, &consumed);
      s = link.Send(put.ok() ? "ok\n" : "error " + put.message() + "\n", In(kDial), peer);
      if (!consumed) break;  // the stream is lost (or the sender gone): the connection ends
    } else if (w.size() == 3 && w[0] == "steps" && a && b) {
      std::string reply = "ok";
      char sep = ' ';
      std::lock_guard lock(mu_);
      const auto it = copies_.find(*a);
      if (it != copies_.end()) {
        for (auto c = it->second.rbegin(); c != it->second.rend(); ++c) {
          if (c->layout == snap::kSharded && c->world_size != *b) continue;
          reply += sep + std::to_string(c->step);
          sep = ',';
        }
      }
      s = link.Send(reply + "\n", In(kDial), peer);
    } else if (w.size() == 3 && w[0] == "get" && a && b) {
      std::unique_lock lock(mu_);
      const Copy* found = nullptr;
      for (const Copy& c : copies_[*a]) {
        if (c.step == static_cast<std::uint64_t>(*b)) found = &c;
      }
      if (found == nullptr) {
        lock.unlock();
        s = link.Send("error no copy of rank " + w[1] + " at step " + w[2] + "\n", In(kDial), peer);
        continue;
      }
      const auto bytes = found->bytes;  // sent without the lock
      ++counters_.fetched;
      lock.unlock();
      s = link.Send("ok " + std::to_string(bytes->size()) + "\n", In(kDial), peer);
      if (s.ok()) s = SendBytes(link, bytes->data(), bytes->size(), In(kCopyDeadline), peer);
    } else {
      s = link.Send("error malformed request '" + line->substr(0, 64) + "'\n", In(kDial), peer);
    }
  }
  close();
}

// The header first: nothing is allocated for a copy that does not say what it is, nor beyond
// what this host has room for (a peer's garbage must not end crun).
Status Replicas::Put(PeerLink& link, std::uint64_t n, std::string_view peer, bool* consumed) {
  if (n < snap::kHeaderBytes || n > kMaxCopy) {
    return InvalidArgument("a copy of " + std::to_string(n) + " bytes");
  }
  std::vector<unsigned char> header(snap::kHeaderBytes);
  CRUN_RETURN_IF_ERROR(ReadExact(link, header.data(), header.size(), In(kCopyDeadline), peer));
  snap::BufferHeader h;
  std::memcpy(&h, header.data(), sizeof h);
  if (!snap::HasMagic(h) || h.payload_bytes != n - snap::kHeaderBytes) {
    return InvalidArgument("a copy that is not a crun snapshot of " + std::to_string(n) + " bytes");
  }
  CRUN_RETURN_IF_ERROR(
      CheckRoom("a copy of rank " + std::to_string(h.rank) + "'s snapshot", n, "", ""));
  Copy c;
  std::shared_ptr<std::vector<unsigned char>> bytes;
  try {
    bytes = std::make_shared<std::vector<unsigned char>>(n);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("no memory for a copy of " + FormatBytes(n));
  }
  std::memcpy(bytes->data(), header.data(), header.size());
  CRUN_RETURN_IF_ERROR(
      ReadExact(link, bytes->data() + header.size(), n - header.size(), In(kCopyDeadline), peer));
  *consumed = true;
  CRUN_RETURN_IF_ERROR(CheckCopy(*bytes));
  c.bytes = std::move(bytes);
  c.step = h.step;
  c.world_size = h.world_size;
  c.layout = h.layout;
  std::lock_guard lock(mu_);
  auto& held = copies_[h.rank];
  std::erase_if(held, [&](const Copy& old) { return old.step == c.step; });
  held.push_back(std::move(c));
  std::sort(held.begin(), held.end(), [](const Copy& x, const Copy& y) { return x.step < y.step; });
  while (held.size() > 2) held.pop_front();
  ++counters_.received;
  counters_.held_bytes = 0;
  for (const auto& [rank, copies] : copies_) {
    for (const Copy& k : copies) counters_.held_bytes += k.bytes->size();
  }
  return Status::Ok();
}

ReplicaCounters Replicas::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

}  // namespace crun::agent
