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

namespace crun::agent {
namespace {

namespace snap = crun::snapshot;
using std::chrono::seconds;

constexpr std::string_view kKeyPrefix = "crun/replica/";
constexpr std::uint64_t kMaxCopy = 1ULL << 40;
constexpr seconds kDial{5}, kCopyDeadline{20}, kDiscovery{60};
constexpr std::size_t kMaxLine = 256;

SteadyClock::time_point In(seconds s) { return SteadyClock::now() + s; }

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

// Over TLS the proof holds for this session only: a relay that holds a session with each side
// has two bindings, and a proof it passes on fails.
std::string Proof(const std::string& token, const PeerLink& link, const std::string& nonce) {
  return ReplicaProof(token, nonce + link.Binding());
}

StatusOr<std::string> ReadLine(PeerLink& link, SteadyClock::time_point deadline,
                               std::string_view peer) {
  std::string line;
  for (;;) {
    char c;
    auto n = link.Recv(&c, 1, 1, deadline, peer);
    if (!n.ok()) return n.status();
    if (c == '\n') return line;
    if (line.size() == kMaxLine) return ProtocolError(std::string(peer) + " sent too long a line");
    line += c;
  }
}

Status ReadExact(PeerLink& link, unsigned char* dst, std::uint64_t n,
                 SteadyClock::time_point deadline, std::string_view peer) {
  std::uint64_t got = 0;
  while (got < n) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(n - got, 1 << 24));
    auto r = link.Recv(reinterpret_cast<char*>(dst + got), 1, want, deadline, peer);
    if (!r.ok()) return r.status();
    got += *r;
  }
  return Status::Ok();
}

Status SendBytes(PeerLink& link, const unsigned char* data, std::uint64_t n,
                 SteadyClock::time_point deadline, std::string_view peer) {
  return link.Send(std::string_view(reinterpret_cast<const char*>(data), n), deadline, peer);
}

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
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

// The address of this host that reaches `host` (a connected UDP socket says, sending nothing).
std::string AddressToward(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    return "127.0.0.1";
  }
  std::string out = "127.0.0.1";
  const int s = ::socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage me{};
  socklen_t len = sizeof me;
  if (s >= 0 && ::connect(s, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* a = me.ss_family == AF_INET6
                        ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&me)->sin6_addr)
                        : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&me)->sin_addr);
    if (::inet_ntop(me.ss_family, a, text, sizeof text) != nullptr) out = text;
  }
  if (s >= 0) ::close(s);
  ::freeaddrinfo(found);
  return out;
}

StatusOr<std::unique_ptr<TcpStoreClient>> StoreOf(const std::string& host, std::uint16_t port,
                                                  seconds timeout) {
  TcpStoreClientOptions o;
  o.host = host;
  o.port = port;
  o.connect_timeout = timeout;
  o.timeout = timeout;
  return TcpStoreClient::Connect(o);
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

void Replicas::NewRound(int group_rank, int nodes, const std::string& store_host,
                        std::uint16_t store_port) {
  {
    std::lock_guard lock(mu_);
    group_rank_ = group_rank;
    store_host_ = store_host;
    store_port_ = store_port;
    next_.clear();
    where_.clear();
    looking_ = nodes > 1;
  }
  nodes_ = nodes;
  const int round = ++round_;
  // The previous round's lookup ends on its own (it sees the round change); it is joined when
  // crun ends, not here, so that a restart never waits for it.
  Reap(discoveries_);
  auto done = std::make_shared<std::atomic<bool>>(false);
  discoveries_.push_back(
      {std::thread([this, done, round, group_rank, nodes, store_host, store_port] {
         Discover(round, group_rank, nodes, store_host, store_port);
         *done = true;
       }),
       done});
}

// Publishes this node's endpoint in the round's store and waits for the next node's.
void Replicas::Discover(int round, int group_rank, int nodes, std::string store_host,
                        std::uint16_t store_port) {
  Lookup(round, group_rank, nodes, store_host, store_port);
  {
    std::lock_guard lock(mu_);
    if (round_ == round) looking_ = false;
  }
  found_.notify_all();
}

void Replicas::Lookup(int round, int group_rank, int nodes, const std::string& store_host,
                      std::uint16_t store_port) {
  // In slices of a second, so that a round that ends (or crun ending: its destructor joins
  // this thread) is noticed within one: a store that is going away may take a connection and
  // never answer it.
  const auto current = [&] { return !stopping_ && round_ == round; };
  TcpStoreClientOptions o;
  o.host = store_host;
  o.port = store_port;
  o.connect_timeout = seconds(30);
  o.timeout = seconds(1);
  auto store = ConnectWhile(o, seconds(1), current);
  if (!current()) return;
  if (!store.ok()) {
    spdlog::warn("crun: snapshots are not replicated this round: {}", store.status().message());
    return;
  }
  const std::string me = FormatEndpoint(AddressToward(store_host, store_port), port_);
  if (Status s = (*store)->Set(std::string(kKeyPrefix) + std::to_string(group_rank), me); !s.ok()) {
    spdlog::warn("crun: snapshots are not replicated this round: {}", s.message());
    return;
  }
  if (nodes < 2) return;
  const std::string key = std::string(kKeyPrefix) + std::to_string((group_rank + 1) % nodes);
  const auto deadline = In(kDiscovery);
  while (current() && SteadyClock::now() < deadline) {
    const Status waited = (*store)->Wait({key}, std::chrono::milliseconds(250));
    if (waited.code() == StatusCode::kTimeout) continue;
    auto next = waited.ok() ? (*store)->Get(key) : StatusOr<std::string>(waited);
    if (!next.ok()) {  // the round's store is gone: the round is over, nothing to say
      spdlog::debug("snapshot copies: the round's store closed: {}", next.status().message());
      return;
    }
    std::lock_guard lock(mu_);
    if (round_ != round) return;
    next_ = *next;
    spdlog::info(
        "snapshot copies: this node keeps the previous node's at {}, and sends its own "
        "to {} (group rank {})",
        me, next_, (group_rank + 1) % nodes);
    return;
  }
  if (current()) {
    spdlog::warn(
        "crun: the next node did not say where it keeps snapshot copies within {} s: "
        "this node's snapshots are not replicated this round",
        kDiscovery.count());
  }
}

StatusOr<PeerLink> Replicas::Dial(const std::string& endpoint) {
  CRUN_ASSIGN_OR_RETURN(const Endpoint e, ParseEndpoint(endpoint, 0));
  CRUN_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTcp(e.host, e.port, In(kDial)));
  PeerLink link(std::move(fd));
  CRUN_RETURN_IF_ERROR(link.Handshake(tls_, false, In(kDial), endpoint));
  CRUN_ASSIGN_OR_RETURN(const std::string hello, ReadLine(link, In(kDial), endpoint));
  const auto w = Words(hello);
  if (w.size() != 3 || w[0] != "crun-replica") {
    return ProtocolError(endpoint + " is not a crun snapshot replica server");
  }
  CRUN_RETURN_IF_ERROR(link.Send("auth " + Proof(token_, link, w[2]) + "\n", In(kDial), endpoint));
  CRUN_ASSIGN_OR_RETURN(const std::string ok, ReadLine(link, In(kDial), endpoint));
  if (ok != "ok") return PermissionDenied(endpoint + " refused this node: " + ok);
  return link;
}

Status Replicas::Send(int local_rank, const unsigned char* header, const unsigned char* payload,
                      std::uint64_t payload_bytes) {
  Link* link = nullptr;
  std::string next;
  {
    // A save right after a round began may come before the next node said where it listens.
    std::unique_lock lock(mu_);
    found_.wait_for(lock, kDial, [&] { return !next_.empty() || !looking_; });
    next = next_;
    link = &links_[local_rank];
  }
  if (next.empty()) return Unavailable("the next node's address is not known");
  Status s;
  if (!link->conn.valid() || link->endpoint != next) {
    auto dialed = Dial(next);
    s = dialed.status();
    if (s.ok()) {
      link->conn = std::move(*dialed);
      link->endpoint = next;
    }
  }
  const auto deadline = In(kCopyDeadline);
  PeerLink& conn = link->conn;
  if (s.ok()) {
    s = conn.Send("put " + std::to_string(snap::kHeaderBytes + payload_bytes) + "\n", deadline,
                  next);
  }
  if (s.ok()) s = SendBytes(conn, header, snap::kHeaderBytes, deadline, next);
  if (s.ok()) s = SendBytes(conn, payload, payload_bytes, deadline, next);
  if (s.ok()) {
    auto answer = ReadLine(conn, deadline, next);
    s = !answer.ok()      ? answer.status()
        : *answer == "ok" ? Status::Ok()
                          : Unavailable(next + " did not keep the copy: " +
                                        answer->substr(std::min<std::size_t>(6, answer->size())));
  }
  std::lock_guard lock(mu_);
  if (!s.ok()) {
    conn.reset();
    ++counters_.send_failures;
    return s;
  }
  ++counters_.sent;
  counters_.sent_bytes += snap::kHeaderBytes + payload_bytes;
  return s;
}

std::vector<std::string> Replicas::Endpoints() {
  std::string host;
  std::uint16_t port = 0;
  int me = 0, nodes = nodes_;
  {
    std::lock_guard lock(mu_);
    host = store_host_;
    port = store_port_;
    me = group_rank_;
  }
  std::vector<std::string> out;
  if (host.empty()) return out;
  auto store = StoreOf(host, port, seconds(5));
  if (!store.ok()) return out;
  const auto deadline = In(seconds(5));
  for (int g = 0; g < nodes; ++g) {
    if (g == me) continue;
    const std::string key = std::string(kKeyPrefix) + std::to_string(g);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (!(*store)->Wait({key}, std::max(left, std::chrono::milliseconds(1))).ok()) continue;
    if (auto v = (*store)->Get(key); v.ok()) out.push_back(*v);
  }
  return out;
}

std::vector<std::uint64_t> Replicas::PeerSteps(std::int64_t rank, std::int64_t world_size) {
  std::set<std::uint64_t> steps;
  for (const std::string& peer : Endpoints()) {
    auto link = Dial(peer);
    if (!link.ok()) continue;
    const auto deadline = In(kDial);
    if (!link->Send("steps " + std::to_string(rank) + " " + std::to_string(world_size) + "\n",
                    deadline, peer)
             .ok()) {
      continue;
    }
    auto answer = ReadLine(*link, deadline, peer);
    if (!answer.ok() || answer->rfind("ok", 0) != 0) continue;
    std::string list = answer->size() > 3 ? answer->substr(3) : "";
    std::replace(list.begin(), list.end(), ',', ' ');
    for (const auto& w : Words(list)) {
      const auto step = ParseInteger(w, 0, INT64_MAX);
      if (!step) continue;
      steps.insert(static_cast<std::uint64_t>(*step));
      std::lock_guard lock(mu_);
      where_[{rank, static_cast<std::uint64_t>(*step)}] = peer;
    }
  }
  return {steps.rbegin(), steps.rend()};
}

StatusOr<int> Replicas::Fetch(std::int64_t rank, std::uint64_t step, NodeSnapshots& memory,
                              int local_rank, std::string* from) {
  std::string peer;
  {
    std::lock_guard lock(mu_);
    const auto it = where_.find({rank, step});
    if (it == where_.end()) {
      return NotFound("no node of the round holds a copy of rank " + std::to_string(rank) +
                      " at step " + std::to_string(step));
    }
    peer = it->second;
  }
  *from = peer;
  CRUN_ASSIGN_OR_RETURN(PeerLink link, Dial(peer));
  const auto deadline = In(kCopyDeadline);
  CRUN_RETURN_IF_ERROR(
      link.Send("get " + std::to_string(rank) + " " + std::to_string(step) + "\n", deadline, peer));
  CRUN_ASSIGN_OR_RETURN(const std::string answer, ReadLine(link, deadline, peer));
  const auto w = Words(answer);
  const auto n = w.size() == 2 && w[0] == "ok" ? ParseInteger(w[1], 0, INT64_MAX) : std::nullopt;
  if (!n || static_cast<std::uint64_t>(*n) > kMaxCopy ||
      static_cast<std::uint64_t>(*n) < snap::kHeaderBytes) {
    return Unavailable(peer + " answered '" + answer + "'");
  }
  std::vector<unsigned char> header(snap::kHeaderBytes);
  CRUN_RETURN_IF_ERROR(ReadExact(link, header.data(), header.size(), deadline, peer));
  snap::BufferHeader h;
  std::memcpy(&h, header.data(), sizeof h);
  if (!snap::HasMagic(h) ||
      h.payload_bytes != static_cast<std::uint64_t>(*n) - snap::kHeaderBytes || h.rank != rank ||
      h.step != step) {
    return Unavailable(peer + " sent something other than rank " + std::to_string(rank) +
                       "'s snapshot at step " + std::to_string(step));
  }
  // Straight into the rank's buffer; Fill checks the checksum once it is all there.
  return memory.Fill(local_rank, h, [&](unsigned char* dst, std::uint64_t bytes) {
    return ReadExact(link, dst, bytes, deadline, peer);
  });
}

ReplicaCounters Replicas::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

}  // namespace crun::agent
