// A deliberately low-level test client: sends raw bytes and reads raw replies, so tests can
// speak either dialect, split frames anywhere, send garbage, and see exactly what comes back.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "base/socket.h"
#include "rendezvous/store/wire.h"

namespace crun::testing {

class RawClient {
 public:
  // Connects to host:port (no handshake); throws on failure.
  RawClient(const std::string& host, std::uint16_t port);
  // The same from a chosen IPv4 source address (127.0.0.2: "another host" on loopback).
  static RawClient From(const std::string& source, const std::string& host, std::uint16_t port);

  void Send(std::string_view bytes);
  void SendRequest(wire::Dialect dialect, const wire::Request& request);
  // Sends VALIDATE + magic: the connection is a 2.x one from here on.
  void Validate();
  // Reads exactly n bytes; throws if the connection closes or `limit` passes.
  std::string Read(std::size_t n, std::chrono::milliseconds limit = std::chrono::seconds(20));
  std::uint8_t ReadU8() { return static_cast<std::uint8_t>(Read(1)[0]); }
  std::int64_t ReadI64();
  std::string ReadBytes();
  // True when the server closed the connection (EOF or reset) within `limit`.
  bool ClosedByPeer(std::chrono::milliseconds limit = std::chrono::seconds(20));
  // PING round trip: proves every earlier reply was consumed and nothing stray is queued.
  void ExpectInSync();
  void Close() { fd_.reset(); }
  int fd() const { return fd_.get(); }

 private:
  RawClient() = default;
  UniqueFd fd_;
  std::string peer_;
  std::uint32_t nonce_ = 1000;
};

}  // namespace crun::testing
