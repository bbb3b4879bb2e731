#include "base/socket.h"

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
    return Unavailable("resolve store host '" + host + "': " + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  Status last = Unavailable("resolve store host '" + host + "': no addresses");
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
      CRUN_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, deadline, "send to store " + std::string(peer)));
      continue;
    }
    return PosixError("send to store " + std::string(peer), errno);
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
    if (n == 0) return Unavailable("store " + std::string(peer) + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      CRUN_RETURN_IF_ERROR(WaitReady(fd, POLLIN, deadline, "read from store " + std::string(peer)));
      continue;
    }
    return PosixError("read from store " + std::string(peer), errno);
  }
  return got;
}

}  // namespace crun
