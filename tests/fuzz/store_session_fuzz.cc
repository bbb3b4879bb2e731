// libFuzzer target: whole store sessions (rendezvous/store_server/session.h) fed arbitrary bytes.
//
// Input: byte 0 picks the chunk size (1..256), bytes 1-2 (little-endian) the length of the
// first client's stream (at most what is left); the rest is the second client's. Both go, in
// alternating chunks, over socketpairs to two Sessions that share one store with tight limits, the
// event loop running between chunks (so one client's SET wakes the other's WAIT, watches fire,
// barriers release); replies are read and dropped. Then both clients close their side. Afterwards
// both sessions must have closed, no wait may be left pending, no session may outlive the loop, and
// nothing may crash, leak (LSan checks every input) or hit undefined behaviour.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <spdlog/spdlog.h>

#include "rendezvous/store_server/session.h"
#include "tests/fuzz/tight_limits.h"

namespace {

namespace asio = boost::asio;
using crun::server_detail::ServerShared;
using crun::server_detail::Session;

[[noreturn]] void Broken(const char* what) {
  std::fprintf(stderr, "store_session_fuzz: %s\n", what);
  std::abort();
}

struct Client {
  int fd = -1;       // the client's end
  bool open = true;  // the server end has not hung up
  std::string_view stream;
  std::size_t at = 0;

  // Sends the next chunk if the socket takes it (what it does not take is sent later).
  void Feed(std::size_t chunk) {
    if (!open || at >= stream.size()) return;
    const std::size_t n = std::min(chunk, stream.size() - at);
    const ssize_t sent = ::send(fd, stream.data() + at, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) at += static_cast<std::size_t>(sent);
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) open = false;  // EPIPE: closed
  }
  // Reads and drops every reply available.
  void Drain() {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) continue;
      if (n == 0) open = false;  // the server closed the connection
      return;
    }
  }
  bool done() const { return !open || at >= stream.size(); }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // every malformed frame would log a line
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const std::size_t chunk = 1 + data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 3, size - 3);
  const std::size_t split = std::min<std::size_t>(rest.size(), data[1] | (data[2] << 8));

  auto shared = std::make_shared<ServerShared>(crun::fuzz::TightLimits());
  shared->name = "fuzz store";
  int closed = 0;
  shared->on_close = [&closed](Session*) { ++closed; };
  Client clients[2];
  clients[0].stream = rest.substr(0, split);
  clients[1].stream = rest.substr(split);
  {
    asio::io_context io;
    for (auto& c : clients) {
      int fds[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) {
        Broken("socketpair failed");
      }
      asio::ip::tcp::socket server_end(io);
      server_end.assign(asio::ip::tcp::v4(), fds[0]);
      c.fd = fds[1];
      std::make_shared<Session>(std::move(server_end), shared)->Start();
    }
    while (!clients[0].done() || !clients[1].done()) {
      for (auto& c : clients) c.Feed(chunk);
      io.poll();
      for (auto& c : clients) c.Drain();
    }
    for (auto& c : clients) ::shutdown(c.fd, SHUT_WR);
    // Every session sees its client's end and closes; bounded, in case one never does.
    for (int turn = 0; turn < 100000 && closed < 2; ++turn) {
      if (io.poll() == 0) io.run_one();
      for (auto& c : clients) c.Drain();
    }
    if (closed != 2) Broken("a session did not close after its client hung up");
    if (shared->state.pending_waits() != 0) Broken("waits pending after every client left");
  }  // the loop and whatever it still held are gone
  if (shared->open.load() != 0) Broken("a session outlived its event loop");
  for (auto& c : clients) ::close(c.fd);
  return 0;
}
