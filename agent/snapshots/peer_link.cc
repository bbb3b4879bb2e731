#include "agent/snapshots/peer_link.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>

#include <boost/algorithm/hex.hpp>
#include <boost/asio/ssl/context.hpp>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

namespace crun::agent {
namespace {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;

constexpr char kExporterLabel[] = "EXPORTER-crun-snapshot-replica";

std::string LastSslError() {
  std::string out;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    out = text;  // the last is the most specific
  }
  return out.empty() ? "the connection ended" : out;
}

// A P-256 key and a self-signed certificate for this crun alone, valid for a year.
Status UseOwnCertificate(SSL_CTX* ctx) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  const auto done = [&](Status s) {
    X509_free(cert);
    EVP_PKEY_free(key);
    return s;
  };
  if (key == nullptr || cert == nullptr) {
    return done(InternalError("cannot make a key for snapshot copies: " + LastSslError()));
  }
  std::uint64_t serial = 0;
  if (::getrandom(&serial, sizeof serial, 0) != sizeof serial) serial = 1;
  X509_set_version(cert, 2);
  ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert), serial >> 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert), 365L * 24 * 3600);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("crun snapshot replica"), -1,
                             -1, 0);
  X509_set_issuer_name(cert, name);
  if (X509_set_pubkey(cert, key) != 1 || X509_sign(cert, key, EVP_sha256()) == 0 ||
      SSL_CTX_use_certificate(ctx, cert) != 1 || SSL_CTX_use_PrivateKey(ctx, key) != 1) {
    return done(InternalError("cannot make a certificate for snapshot copies: " + LastSslError()));
  }
  return done(Status::Ok());
}

// OpenSSL's socket BIO writes with write(2): a peer that has gone raises SIGPIPE, which kills a
// process that has not ignored it (a test binary, a program embedding the agent) instead of
// failing this one link. This BIO moves the same bytes with send(MSG_NOSIGNAL) and recv, and
// keeps the socket BIO's retry and end-of-file conventions so that SSL_get_error reads alike.
int NoSigpipeWrite(BIO* b, const char* data, int n) {
  BIO_clear_retry_flags(b);
  const ssize_t w = ::send(BIO_get_fd(b, nullptr), data, static_cast<std::size_t>(n), MSG_NOSIGNAL);
  if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_write(b);
  return static_cast<int>(w);
}

int NoSigpipeRead(BIO* b, char* out, int n) {
  BIO_clear_retry_flags(b);
  const ssize_t r = ::recv(BIO_get_fd(b, nullptr), out, static_cast<std::size_t>(n), 0);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(b);
  if (r == 0) BIO_set_flags(b, BIO_FLAGS_IN_EOF);
  return static_cast<int>(r);
}

long NoSigpipeCtrl(BIO* b, int cmd, long num, void* ptr) {
  switch (cmd) {
    case BIO_C_SET_FD:
      BIO_set_data(b, reinterpret_cast<void*>(static_cast<std::intptr_t>(*static_cast<int*>(ptr))));
      BIO_set_shutdown(b, static_cast<int>(num));
      BIO_set_init(b, 1);
      return 1;
    case BIO_C_GET_FD:
      if (BIO_get_init(b) == 0) return -1;
      if (ptr != nullptr)
        *static_cast<int*>(ptr) =
            static_cast<int>(reinterpret_cast<std::intptr_t>(BIO_get_data(b)));
      return static_cast<long>(reinterpret_cast<std::intptr_t>(BIO_get_data(b)));
    case BIO_CTRL_EOF:
      return BIO_test_flags(b, BIO_FLAGS_IN_EOF) != 0 ? 1 : 0;
    case BIO_CTRL_FLUSH:
      return 1;
    default:
      return 0;
  }
}

// The socket stays the PeerLink's (BIO_NOCLOSE): this BIO never closes it.
BIO* NoSigpipeBio(int fd) {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                                 "crun socket without SIGPIPE");
    if (m == nullptr) return m;
    BIO_meth_set_write(m, NoSigpipeWrite);
    BIO_meth_set_read(m, NoSigpipeRead);
    BIO_meth_set_ctrl(m, NoSigpipeCtrl);
    return m;
  }();
  if (method == nullptr) return nullptr;
  BIO* b = BIO_new(method);
  if (b != nullptr) BIO_set_fd(b, fd, BIO_NOCLOSE);
  return b;
}

int RemainingMs(SteadyClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
}

// Runs one OpenSSL call on a non-blocking socket until it makes progress, waiting for the
// socket as OpenSSL asks, up to the deadline. Returns the call's positive result.
template <class Op>
StatusOr<int> Pump(SSL* ssl, int fd, Op op, SteadyClock::time_point deadline, std::string_view peer,
                   std::string_view what) {
  for (;;) {
    ERR_clear_error();
    const int r = op();
    if (r > 0) return r;
    const int e = SSL_get_error(ssl, r);
    short events = 0;
    if (e == SSL_ERROR_WANT_READ) {
      events = POLLIN;
    } else if (e == SSL_ERROR_WANT_WRITE) {
      events = POLLOUT;
    } else if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)) {
      return Unavailable(std::string(peer) + " closed the connection");
    } else {
      return Unavailable(std::string(peer) + ": TLS " + std::string(what) +
                         " failed: " + LastSslError());
    }
    const int ms = RemainingMs(deadline);
    if (ms == 0) {
      return TimeoutError(std::string(peer) + ": no TLS " + std::string(what) + " in time");
    }
    pollfd p{fd, events, 0};
    if (::poll(&p, 1, ms) < 0 && errno != EINTR) {
      return PosixError("waiting for " + std::string(peer), errno);
    }
  }
}

}  // namespace

struct PeerTls::Contexts {
  ssl::context server{ssl::context::tls_server};
  ssl::context client{ssl::context::tls_client};
};

PeerTls::PeerTls(std::unique_ptr<Contexts> c, bool verifies)
    : c_(std::move(c)), verifies_(verifies) {}

PeerTls::~PeerTls() = default;

StatusOr<std::shared_ptr<PeerTls>> PeerTls::Make(const Security& files) {
  auto c = std::make_unique<Contexts>();
  const bool own = !files.cert_pem.empty() && !files.key_pem.empty();
  const bool verifies = own && !files.ca_pem.empty();
  for (ssl::context* ctx : {&c->server, &c->client}) {
    SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_3_VERSION);
    boost::system::error_code ec;
    if (own) {
      ctx->use_certificate_chain(asio::buffer(files.cert_pem), ec);
      if (!ec) ctx->use_private_key(asio::buffer(files.key_pem), ssl::context::pem, ec);
      if (ec) return InvalidArgument("--tls-cert/--tls-key for snapshot copies: " + ec.message());
    } else if (Status s = UseOwnCertificate(ctx->native_handle()); !s.ok()) {
      return s;
    }
    if (verifies) {
      ctx->add_certificate_authority(asio::buffer(files.ca_pem), ec);
      if (ec) return InvalidArgument("--tls-ca for snapshot copies: " + ec.message());
      ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
      // Each node's certificate serves both ends here, whatever its extended key usage says
      // (a client certificate for the service often says clientAuth only): the CA's signature
      // is what is checked.
      SSL_CTX_set_purpose(ctx->native_handle(), X509_PURPOSE_ANY);
    } else {
      ctx->set_verify_mode(ssl::verify_none);
    }
  }
  return std::shared_ptr<PeerTls>(new PeerTls(std::move(c), verifies));
}

PeerLink::PeerLink(PeerLink&& other) noexcept
    : fd_(std::move(other.fd_)), ssl_(std::exchange(other.ssl_, nullptr)) {}

PeerLink& PeerLink::operator=(PeerLink&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::move(other.fd_);
    ssl_ = std::exchange(other.ssl_, nullptr);
  }
  return *this;
}

PeerLink::~PeerLink() { reset(); }

void PeerLink::reset() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  ssl_ = nullptr;
  fd_.reset();
}

Status PeerLink::Handshake(const std::shared_ptr<PeerTls>& tls, bool accept,
                           SteadyClock::time_point deadline, std::string_view peer) {
  if (!tls) return Status::Ok();
  const int raw = fd_.get();
  const int flags = ::fcntl(raw, F_GETFL);
  if (flags < 0 || ::fcntl(raw, F_SETFL, flags | O_NONBLOCK) != 0) {
    return PosixError("the connection with " + std::string(peer), errno);
  }
  SSL_CTX* ctx = accept ? tls->c_->server.native_handle() : tls->c_->client.native_handle();
  ssl_ = SSL_new(ctx);
  BIO* bio = ssl_ == nullptr ? nullptr : NoSigpipeBio(raw);
  if (bio == nullptr) {
    if (ssl_ != nullptr) SSL_free(ssl_);
    ssl_ = nullptr;
    return InternalError("cannot start TLS with " + std::string(peer) + ": " + LastSslError());
  }
  SSL_set_bio(ssl_, bio, bio);  // the SSL owns the BIO from here
  SSL* s = ssl_;
  auto done = Pump(
      s, raw, [&] { return accept ? SSL_accept(s) : SSL_connect(s); }, deadline, peer, "handshake");
  if (!done.ok()) {
    SSL_free(ssl_);
    ssl_ = nullptr;
    return done.status();
  }
  return Status::Ok();
}

Status PeerLink::Send(std::string_view data, SteadyClock::time_point deadline,
                      std::string_view peer) {
  if (ssl_ == nullptr) return SendAll(fd_.get(), data, deadline, peer);
  while (!data.empty()) {
    const int chunk = static_cast<int>(std::min<std::size_t>(data.size(), 1 << 20));
    auto n = Pump(
        ssl_, fd_.get(), [&] { return SSL_write(ssl_, data.data(), chunk); }, deadline, peer,
        "write");
    if (!n.ok()) return n.status();
    data.remove_prefix(static_cast<std::size_t>(*n));
  }
  return Status::Ok();
}

StatusOr<std::size_t> PeerLink::Recv(char* dst, std::size_t min, std::size_t max,
                                     SteadyClock::time_point deadline, std::string_view peer) {
  if (ssl_ == nullptr) return RecvSome(fd_.get(), dst, min, max, deadline, peer);
  std::size_t got = 0;
  while (got < min) {
    const int want = static_cast<int>(std::min<std::size_t>(max - got, 1 << 30));
    auto n = Pump(
        ssl_, fd_.get(), [&] { return SSL_read(ssl_, dst + got, want); }, deadline, peer, "read");
    if (!n.ok()) return n.status();
    got += static_cast<std::size_t>(*n);
  }
  return got;
}

std::string PeerLink::Binding() const {
  if (ssl_ == nullptr) return "";
  unsigned char out[32];
  if (SSL_export_keying_material(ssl_, out, sizeof out, kExporterLabel, sizeof kExporterLabel - 1,
                                 nullptr, 0, 0) != 1) {
    return "";
  }
  std::string hex;
  boost::algorithm::hex_lower(std::begin(out), std::end(out), std::back_inserter(hex));
  return hex;
}

}  // namespace crun::agent
