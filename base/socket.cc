#include "base/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

namespace crun {
namespace {

// Milliseconds left until `deadline`, clamped for poll(); -1 = forever.
int PollTimeout(SteadyClock::time_point deadline) {
  if (deadline == SteadyClock::time_point::max()) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  if (left <= 0) return 0;
  return left > 1'000'000 ? 1'000'000 : static_cast<int>(left);
}

// Waits until `fd` is ready for `events`. kTimeout at the deadline.
Status WaitReady(int fd, short events, SteadyClock::time_point deadline, std::string_view what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, PollTimeout(deadline));
    if (n > 0) return Status::Ok();
    if (n == 0) return TimeoutError(std::string(what) + ": timed out");
    if (errno != EINTR) return PosixError(std::string(what) + ": poll", errno);
  }
}

Status ConnectOne(const addrinfo* ai, SteadyClock::time_point deadline, std::string_view peer,
                  UniqueFd* out) {
  UniqueFd fd(
      ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
  const std::string what = "connect to " + std::string(peer);
  if (!fd.valid()) return PosixError(what + ": socket", errno);
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return PosixError(what, errno);
    CRUN_RETURN_IF_ERROR(WaitReady(fd.get(), POLLOUT, deadline, what));
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return PosixError(what, err);
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  *out = std::move(fd);
  return Status::Ok();
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int UniqueFd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

SteadyClock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return SteadyClock::time_point::max();
  return SteadyClock::now() + timeout;
}

StatusOr<UniqueFd> ConnectTcp(const std::string& host, std::uint16_t port,
                              SteadyClock::time_point deadline) {
  const std::string peer = FormatEndpoint(host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    return Unavailable("resolve host '" + host + "': " + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  Status last = Unavailable("resolve host '" + host + "': no addresses");
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd;
    last = ConnectOne(ai, deadline, peer, &fd);
    if (last.ok()) return fd;
  }
  return last;
}

Status SendAll(int fd, std::string_view data, SteadyClock::time_point deadline,
               std::string_view peer) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      CRUN_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, deadline, "send to " + std::string(peer)));
      continue;
    }
    return PosixError("send to " + std::string(peer), errno);
  }
  return Status::Ok();
}

StatusOr<std::size_t> RecvSome(int fd, char* dst, std::size_t min, std::size_t max,
                               SteadyClock::time_point deadline, std::string_view peer) {
  std::size_t got = 0;
  while (got < min) {
    const ssize_t n = ::recv(fd, dst + got, max - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return Unavailable(std::string(peer) + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      CRUN_RETURN_IF_ERROR(WaitReady(fd, POLLIN, deadline, "read from " + std::string(peer)));
      continue;
    }
    return PosixError("read from " + std::string(peer), errno);
  }
  return got;
}

Status ListenError(std::string_view where, int err) {
  const std::string w(where);
  switch (err) {
    case EADDRINUSE:
      return Unavailable("cannot listen on " + w +
                         ": the address is in use (another process "
                         "serves it)");
    case EADDRNOTAVAIL:
      return InvalidArgument("cannot listen on " + w + ": not an address of this host");
    case EACCES:
    case EPERM:
      return PermissionDenied("cannot listen on " + w + ": permission denied");
    default:
      return PosixError("cannot listen on " + w, err);
  }
}

namespace {

using AddrList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

StatusOr<AddrList> ResolveUdp(const std::string& host, std::uint16_t port, int flags,
                              const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = flags | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                   std::to_string(port).c_str(), &hints, &found);
      rc != 0) {
    return InvalidArgument(what + ": " + ::gai_strerror(rc));
  }
  return AddrList(found, &::freeaddrinfo);
}

}  // namespace

std::uint16_t LocalPort(int fd) {
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) return 0;
  return ntohs(bound.ss_family == AF_INET6
                   ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                   : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
}

StatusOr<std::vector<UniqueFd>> BindUdp(const std::string& host, std::uint16_t port) {
  const std::string where = "udp " + FormatEndpoint(host.empty() ? "*" : host, port);
  CRUN_ASSIGN_OR_RETURN(auto list, ResolveUdp(host, port, AI_PASSIVE, "cannot bind " + where));
  bool v4 = false, v6 = false;
  for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    v4 = v4 || ai->ai_family == AF_INET;
    v6 = v6 || ai->ai_family == AF_INET6;
  }
  std::vector<UniqueFd> fds;
  Status skipped = Status::Ok();  // an address this host lacks (no IPv6): the others serve
  for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid() && errno == EAFNOSUPPORT) {
      skipped = PosixError("cannot bind " + where, errno);
      continue;
    }
    if (!fd.valid()) return PosixError("cannot bind " + where, errno);
    if (ai->ai_family == AF_INET6 && v4) {
      const int on = 1;
      (void)::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    }
    // Port 0: every socket on the port the first one got.
    if (!fds.empty() && port == 0) {
      const std::uint16_t first = LocalPort(fds.front().get());
      if (ai->ai_family == AF_INET6) {
        reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_port = htons(first);
      } else {
        reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_port = htons(first);
      }
    }
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EADDRNOTAVAIL) return ListenError(where, errno);
      skipped = ListenError(where, errno);
      continue;
    }
    fds.push_back(std::move(fd));
  }
  if (fds.empty()) {
    return skipped.ok() ? InvalidArgument("cannot bind " + where + ": no address") : skipped;
  }
  return fds;
}

StatusOr<UniqueFd> ConnectUdp(const std::string& host, std::uint16_t port) {
  const std::string where = "udp " + FormatEndpoint(host, port);
  CRUN_ASSIGN_OR_RETURN(auto list, ResolveUdp(host, port, AI_NUMERICHOST, where));
  UniqueFd fd(::socket(list->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid() || ::connect(fd.get(), list->ai_addr, list->ai_addrlen) != 0) {
    return PosixError(where, errno);
  }
  return fd;
}

Status CheckCanListen(const std::string& host, std::uint16_t port) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    len = sizeof *v6;
  } else {
    return Status::Ok();
  }
  UniqueFd fd(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid())
    return PosixError("cannot open a socket for " + FormatEndpoint(host, port), errno);
  const int on = 1, off = 0;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (addr.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&v6->sin6_addr)) {
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);  // as "::" serves
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return ListenError(FormatEndpoint(host, port), errno);
  }
  return Status::Ok();
}

}  // namespace crun
