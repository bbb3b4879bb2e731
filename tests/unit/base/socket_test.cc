// Why a server cannot listen, said the same way by every server: a port in use, an address
// that is not this host's. Real sockets on loopback; TEST-NET-3 (203.0.113.0/24) is never a
// local address.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "base/socket.h"

namespace {

// A socket listening on 127.0.0.1 at a free port; its port.
struct Listener {
  crun::UniqueFd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  std::uint16_t port = 0;
  Listener() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd.get(), 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
};

}  // namespace

TEST_CASE("listen errors: in use, not this host's, no permission", "[socket]") {
  using crun::ListenError;
  using crun::StatusCode;
  CHECK(ListenError("127.0.0.1:1", EADDRINUSE).code() == StatusCode::kUnavailable);
  CHECK(ListenError("127.0.0.1:1", EADDRINUSE).message() ==
        "cannot listen on 127.0.0.1:1: the address is in use (another process serves it)");
  CHECK(ListenError("10.9.9.9:1", EADDRNOTAVAIL).code() == StatusCode::kInvalidArgument);
  CHECK(ListenError("0.0.0.0:80", EACCES).code() == StatusCode::kPermissionDenied);
}

TEST_CASE("CheckCanListen binds to find out, and leaves nothing bound", "[socket]") {
  Listener taken;
  const crun::Status in_use = crun::CheckCanListen("127.0.0.1", taken.port);
  CHECK(in_use.code() == crun::StatusCode::kUnavailable);
  CHECK_THAT(in_use.message(), Catch::Contains("127.0.0.1:" + std::to_string(taken.port)));
  const crun::Status elsewhere = crun::CheckCanListen("203.0.113.7", 29400);
  CHECK(elsewhere.code() == crun::StatusCode::kInvalidArgument);
  CHECK_THAT(elsewhere.message(), Catch::Contains("not an address of this host"));
  CHECK(crun::CheckCanListen("127.0.0.1", 0).ok());
  CHECK(crun::CheckCanListen("node-a", 29400).ok());  // a name is not checked
  // What the check bound is closed again: the port is free for the server itself.
  std::uint16_t freed = 0;
  {
    Listener l;
    freed = l.port;
  }
  CHECK(crun::CheckCanListen("127.0.0.1", freed).ok());
  CHECK(crun::CheckCanListen("127.0.0.1", freed).ok());
}

// UDP as the rendezvous service's heartbeats use it: a name bound on every address it resolves
// to, all on one port; a connected socket reaches each; a port taken or an address not this
// host's is an error naming "udp HOST:PORT".
TEST_CASE("BindUdp binds every address of a name on one port, ConnectUdp reaches each",
          "[socket]") {
  auto bound = crun::BindUdp("localhost", 0);
  REQUIRE(bound.ok());
  REQUIRE_FALSE(bound->empty());
  const std::uint16_t port = crun::LocalPort(bound->front().get());
  REQUIRE(port != 0);
  for (const auto& fd : *bound) CHECK(crun::LocalPort(fd.get()) == port);
  // Each address the name gave (127.0.0.1, and ::1 where this host has IPv6) takes a datagram
  // on its own socket.
  for (const auto& fd : *bound) {
    sockaddr_storage at{};
    socklen_t len = sizeof at;
    REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&at), &len) == 0);
    const std::string ip = at.ss_family == AF_INET6 ? "::1" : "127.0.0.1";
    INFO(ip);
    auto to = crun::ConnectUdp(ip, port);
    REQUIRE(to.ok());
    REQUIRE(::send(to->get(), "beat", 4, 0) == 4);
    pollfd p{fd.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5'000) == 1);
    char got[8] = {};
    CHECK(::recv(fd.get(), got, sizeof got, 0) == 4);
    CHECK(std::string(got) == "beat");
  }
  const auto taken = crun::BindUdp("127.0.0.1", port);
  REQUIRE_FALSE(taken.ok());
  CHECK(taken.status().code() == crun::StatusCode::kUnavailable);
  CHECK_THAT(taken.status().message(), Catch::Contains("udp 127.0.0.1:" + std::to_string(port)));
  const auto elsewhere = crun::BindUdp("203.0.113.7", 29400);
  REQUIRE_FALSE(elsewhere.ok());
  CHECK_THAT(elsewhere.status().message(), Catch::Contains("udp 203.0.113.7:29400"));
  CHECK_THAT(elsewhere.status().message(), Catch::Contains("not an address of this host"));
  const auto not_ip = crun::ConnectUdp("not-an-ip", 29400);
  REQUIRE_FALSE(not_ip.ok());
  CHECK_THAT(not_ip.status().message(), Catch::Contains("udp not-an-ip:29400"));
}
