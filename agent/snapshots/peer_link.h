// One connection between two nodes' snapshot replica servers (agent/snapshots/replicas.h):
// plain TCP, or TLS 1.3 when the job has TLS (docs/checkpoints.md, "Strangers"), with a
// deadline on every read and write either way.
//
// With TLS, a node presents its own certificate (--tls-cert/--tls-key) when it has one, else
// one made for this crun alone (self-signed, in memory). Peers are proven by the job's token,
// bound to the TLS session (its RFC 5705 exporter goes into the token's HMAC), so that a
// relay in the middle, which holds two sessions, cannot pass a node's proof on. A node with a
// certificate of its own and --tls-ca (a mutual-TLS job) also verifies the other side's
// certificate against that CA, and the server requires one.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "base/security.h"
#include "base/socket.h"
#include "base/status.h"

struct ssl_st;  // OpenSSL's SSL

namespace crun::agent {

// The TLS settings of one crun's peers: a server side and a client side.
class PeerTls {
 public:
  // From the job's TLS as crun loaded it (its token is not used here).
  static StatusOr<std::shared_ptr<PeerTls>> Make(const Security& job);
  ~PeerTls();
  PeerTls(const PeerTls&) = delete;
  PeerTls& operator=(const PeerTls&) = delete;

  // Whether peers' certificates are verified against the job's CA (a mutual-TLS job).
  bool verifies() const { return verifies_; }

 private:
  friend class PeerLink;
  struct Contexts;
  explicit PeerTls(std::unique_ptr<Contexts> c, bool verifies);
  std::unique_ptr<Contexts> c_;
  bool verifies_ = false;
};

class PeerLink {
 public:
  PeerLink() = default;
  explicit PeerLink(UniqueFd fd) : fd_(std::move(fd)) {}  // plain TCP
  PeerLink(PeerLink&& other) noexcept;
  PeerLink& operator=(PeerLink&& other) noexcept;
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;
  ~PeerLink();

  // The TLS handshake on the connected socket, as the server (`accept`) or the client; `tls`
  // null: plain TCP, nothing to do. Errors name `peer`; the socket stays this link's either way.
  Status Handshake(const std::shared_ptr<PeerTls>& tls, bool accept,
                   SteadyClock::time_point deadline, std::string_view peer);

  Status Send(std::string_view data, SteadyClock::time_point deadline, std::string_view peer);
  // At least `min` and at most `max` bytes; kUnavailable when the peer closes.
  StatusOr<std::size_t> Recv(char* dst, std::size_t min, std::size_t max,
                             SteadyClock::time_point deadline, std::string_view peer);
  // 32 bytes unique to this TLS session, in hex, the same on both ends; "" on plain TCP.
  std::string Binding() const;

  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }
  bool tls() const { return ssl_ != nullptr; }
  void reset();

 private:
  UniqueFd fd_;
  ssl_st* ssl_ = nullptr;
};

}  // namespace crun::agent
