// The replica protocol's pieces both of its sides use (replicas.h): the limits and deadlines,
// a line and exact bytes on a link, and the proof of the job's token on it. Private to
// replicas.cc (the server) and replica_peers.cc (this node as a client).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <crun/worker/snapshot_layout.h>

#include "agent/snapshots/peer_link.h"
#include "agent/snapshots/replicas.h"

namespace crun::agent::replica_wire {

namespace snap = crun::snapshot;
using std::chrono::seconds;

inline constexpr std::string_view kKeyPrefix = "crun/replica/";
inline constexpr std::uint64_t kMaxCopy = 1ULL << 40;
inline constexpr seconds kDial{5}, kCopyDeadline{20}, kDiscovery{60};
inline constexpr std::size_t kMaxLine = 256;

inline SteadyClock::time_point In(seconds s) { return SteadyClock::now() + s; }

// Over TLS the proof holds for this session only: a relay that holds a session with each side
// has two bindings, and a proof it passes on fails.
inline std::string Proof(const std::string& token, const PeerLink& link, const std::string& nonce) {
  return ReplicaProof(token, nonce + link.Binding());
}

inline StatusOr<std::string> ReadLine(PeerLink& link, SteadyClock::time_point deadline,
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

inline Status ReadExact(PeerLink& link, unsigned char* dst, std::uint64_t n,
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

inline Status SendBytes(PeerLink& link, const unsigned char* data, std::uint64_t n,
                        SteadyClock::time_point deadline, std::string_view peer) {
  return link.Send(std::string_view(reinterpret_cast<const char*>(data), n), deadline, peer);
}

inline std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace crun::agent::replica_wire
