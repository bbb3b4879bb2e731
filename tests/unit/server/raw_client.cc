#include "tests/unit/server/raw_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <stdexcept>

namespace crun::testing {

RawClient::RawClient(const std::string& host, std::uint16_t port)
    : peer_(FormatEndpoint(host, port)) {
  auto fd = ConnectTcp(host, port, SteadyClock::now() + std::chrono::seconds(20));
  if (!fd.ok()) throw std::runtime_error(fd.status().ToString());
  fd_ = std::move(fd).value();
}

RawClient RawClient::From(const std::string& source, const std::string& host, std::uint16_t port) {
  RawClient c;
  c.peer_ = FormatEndpoint(host, port);
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &to.sin_addr);
  if (fd.get() < 0 || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    throw std::runtime_error("connect from " + source + " to " + c.peer_ + " failed");
  }
  c.fd_ = std::move(fd);
  return c;
}

void RawClient::Send(std::string_view bytes) {
  auto s = SendAll(fd_.get(), bytes, SteadyClock::now() + std::chrono::seconds(20), peer_);
  if (!s.ok()) throw std::runtime_error(s.ToString());
}

void RawClient::SendRequest(wire::Dialect dialect, const wire::Request& request) {
  std::string out;
  wire::EncodeRequest(dialect, request, &out);
  Send(out);
}

void RawClient::Validate() {
  wire::Request v;
  v.command = wire::Command::kValidate;
  v.nonce = wire::kValidationMagic;
  SendRequest(wire::Dialect::kModern, v);
}

std::string RawClient::Read(std::size_t n, std::chrono::milliseconds limit) {
  std::string out(n, '\0');
  auto got = RecvSome(fd_.get(), out.data(), n, n, SteadyClock::now() + limit, peer_);
  if (!got.ok()) throw std::runtime_error(got.status().ToString());
  return out;
}

std::int64_t RawClient::ReadI64() {
  return static_cast<std::int64_t>(wire::LoadU64(Read(8).data()));
}

std::string RawClient::ReadBytes() {
  const auto len = wire::LoadU64(Read(8).data());
  return Read(len);
}

bool RawClient::ClosedByPeer(std::chrono::milliseconds limit) {
  pollfd p{fd_.get(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return false;
  char c;
  const ssize_t n = ::recv(fd_.get(), &c, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

void RawClient::ExpectInSync() {
  wire::Request ping;
  ping.command = wire::Command::kPing;
  ping.nonce = ++nonce_;
  SendRequest(wire::Dialect::kModern, ping);
  const auto echo = wire::LoadU32(Read(4).data());
  if (echo != ping.nonce) {
    throw std::runtime_error("stream out of sync: PING " + std::to_string(ping.nonce) +
                             " answered with " + std::to_string(echo));
  }
}

}  // namespace crun::testing
