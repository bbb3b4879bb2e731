// Blocking POSIX TCP helpers with deadlines, for clients (no Boost: the worker SDK must build
// on machines that lack it). errno is turned into a Status here and nowhere else; every
// message names the peer as host:port.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/endpoint.h"
#include "base/status.h"

namespace crun {

using SteadyClock = std::chrono::steady_clock;

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// One connection attempt: resolves `host` and tries each address until one accepts or the
// deadline passes. The socket comes back blocking, with TCP_NODELAY and close-on-exec.
StatusOr<UniqueFd> ConnectTcp(const std::string& host, std::uint16_t port,
                              SteadyClock::time_point deadline);

// Writes all of `data`; kTimeout if the peer stops reading until the deadline. `peer` names
// the other side in errors, as the caller knows it ("store 10.0.0.1:29500").
Status SendAll(int fd, std::string_view data, SteadyClock::time_point deadline,
               std::string_view peer);

// Reads at least `min` and at most `max` bytes into `dst`; returns the count.
// kUnavailable when the peer closes, kTimeout at the deadline.
StatusOr<std::size_t> RecvSome(int fd, char* dst, std::size_t min, std::size_t max,
                               SteadyClock::time_point deadline, std::string_view peer);

// A failure to bind or listen on `where` (host:port), the same from every server: the address
// in use is kUnavailable (someone serves it: a caller may join them), not an address of this
// host kInvalidArgument, no permission kPermissionDenied; anything else PosixError.
Status ListenError(std::string_view where, int err);

// Whether a TCP server could listen on host:port now, by binding a socket there and closing
// it: Ok, or ListenError. For servers whose own library says no more than "failed" (gRPC). A
// host that is not an IP literal is not checked (Ok).
Status CheckCanListen(const std::string& host, std::uint16_t port);

// Non-blocking, close-on-exec UDP sockets bound on `port`, one for each address `host` resolves
// to (a name such as "localhost" may give an IPv4 and an IPv6 one, as a TCP server on it
// listens on both; an IPv6 socket beside an IPv4 one is IPv6-only). An address this host does
// not have is skipped while another binds, as gRPC skips it. Port 0: the kernel picks
// the first's, and the others take the same. Errors name "udp HOST:PORT" (ListenError).
StatusOr<std::vector<UniqueFd>> BindUdp(const std::string& host, std::uint16_t port);

// A non-blocking, close-on-exec UDP socket connected to host:port (an IP literal), so that a
// port that refuses (ICMP) comes back as an error on a later send or receive.
StatusOr<UniqueFd> ConnectUdp(const std::string& host, std::uint16_t port);

// The port a bound socket has.
std::uint16_t LocalPort(int fd);

// Deadline `timeout` from now; a zero timeout means "no deadline" (c10d's kNoTimeout).
SteadyClock::time_point DeadlineAfter(std::chrono::milliseconds timeout);

}  // namespace crun
