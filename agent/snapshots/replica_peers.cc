// This node as the replicas' client (replicas.h): where the next node keeps copies (found on
// the round's store), dialing a peer, sending this node's copies, asking peers for theirs.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

#include <spdlog/spdlog.h>

#include "agent/snapshots/node_snapshots.h"
#include "agent/snapshots/replica_wire.h"
#include "base/endpoint.h"
#include "base/numbers.h"
#include "rendezvous/store/tcp_store_client.h"

namespace crun::agent {
namespace {

using namespace replica_wire;  // the protocol's own pieces

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

}  // namespace crun::agent
