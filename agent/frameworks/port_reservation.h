// Ports held for a round's workers (--contract tensorflow, jax: agent/frameworks/contracts.h) from
// the join that publishes them until the workers start: each is a TCP socket bound to a port the
// kernel picks on every address ([::] dual-stack, else 0.0.0.0), so no other process's bind
// and no outgoing connection takes it meanwhile. Released just before the workers start, so
// that they can bind it. A port taken in the moment between is a worker's bind error: the
// worker fails, and the restart reserves new ports (docs/frameworks.md).
#pragma once

#include <cstdint>
#include <vector>

#include "base/socket.h"
#include "base/status.h"

namespace crun::agent {

class PortReservation {
 public:
  // `count` ports (none for 0); an error names the failing bind.
  static StatusOr<PortReservation> Reserve(int count);

  const std::vector<std::uint16_t>& ports() const { return ports_; }
  // Closes the sockets; the ports stay listed.
  void Release() { sockets_.clear(); }
  // The bound socket of port `i`, for crun itself to listen on (Horovod's rendezvous): no
  // moment passes in which another process could take it. Invalid once released.
  UniqueFd Take(std::size_t i) { return i < sockets_.size() ? std::move(sockets_[i]) : UniqueFd(); }

 private:
  std::vector<UniqueFd> sockets_;
  std::vector<std::uint16_t> ports_;
};

}  // namespace crun::agent
