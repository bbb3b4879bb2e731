#include "agent/frameworks/port_reservation.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>

namespace crun::agent {
namespace {

// A socket bound to a free port on every address, and that port.
StatusOr<std::pair<UniqueFd, std::uint16_t>> BindFree() {
  UniqueFd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.valid()) {
    const int off = 0;  // IPv4 too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) != 0 ||
        ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      return PosixError("reserve a port on [::]", errno);
    }
    socklen_t len = sizeof a;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return PosixError("read the port reserved on [::]", errno);
    }
    return std::pair{std::move(fd), ntohs(a.sin6_port)};
  }
  if (errno != EAFNOSUPPORT) return PosixError("reserve a port: socket", errno);
  fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));  // a host without IPv6
  if (!fd.valid()) return PosixError("reserve a port: socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    return PosixError("reserve a port on 0.0.0.0", errno);
  }
  socklen_t len = sizeof a;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return PosixError("read the port reserved on 0.0.0.0", errno);
  }
  return std::pair{std::move(fd), ntohs(a.sin_port)};
}

}  // namespace

StatusOr<PortReservation> PortReservation::Reserve(int count) {
  PortReservation r;
  for (int i = 0; i < count; ++i) {
    auto bound = BindFree();
    if (!bound.ok()) return bound.status();
    r.ports_.push_back(bound->second);
    r.sockets_.push_back(std::move(bound->first));
  }
  return r;
}

}  // namespace crun::agent
