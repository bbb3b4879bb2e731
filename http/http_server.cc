#include "http/http_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <memory>
#include <set>
#include <type_traits>
#include <utility>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "base/endpoint.h"
#include "base/socket.h"

namespace crun::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

constexpr std::size_t kHeaderLimit = 8 * 1024;

class Server;

class Connection {
 public:
  virtual ~Connection() = default;
  virtual void Run() = 0;
  virtual void Close() = 0;
};

// One client's connection over plain TCP (beast::tcp_stream) or TLS (beast::ssl_stream).
template <typename Stream>
class ConnectionOf final : public Connection,
                           public std::enable_shared_from_this<ConnectionOf<Stream>> {
 public:
  template <typename... Args>
  ConnectionOf(Server* server, std::shared_ptr<const bool> stopped,
               std::chrono::milliseconds timeout, Args&&... stream_args)
      : server_(server),
        stopped_(std::move(stopped)),
        stream_(std::forward<Args>(stream_args)...),
        timeout_(timeout) {}

  void Run() override;
  void Close() override {
    beast::error_code ignored;
    auto& socket = beast::get_lowest_layer(stream_).socket();
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;
  void Read();
  void Answer();
  void Done();
  void Arm() { beast::get_lowest_layer(stream_).expires_after(timeout_); }

  Server* server_;  // valid while *stopped_ is false (a handler may run after it is gone)
  std::shared_ptr<const bool> stopped_;
  Stream stream_;
  std::chrono::milliseconds timeout_;
  beast::flat_buffer buffer_;
  std::unique_ptr<bhttp::request_parser<bhttp::string_body>> parser_;
  bhttp::response<bhttp::string_body> response_;
};

class Server final : public HttpServer {
 public:
  Server(asio::io_context& io, HttpServerOptions o,
         std::function<HttpResponse(const HttpRequest&)> handle)
      : io_(io), o_(std::move(o)), handle_(std::move(handle)), acceptor_(io) {
    for (const auto& a : o_.allowed_peers) {
      beast::error_code ec;
      const auto address = asio::ip::make_address(a, ec);
      if (!ec) allowed_.insert(address.is_v4() ? address : Unmapped(address));
    }
  }

  Status Listen() {
    if (o_.tls) CRUN_RETURN_IF_ERROR(MakeTlsContext(*o_.tls));
    beast::error_code ec;
    if (o_.bound_fd >= 0) {
      UniqueFd fd(o_.bound_fd);
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
        return PosixError("an HTTP server's reserved socket", errno);
      }
      acceptor_.assign(ss.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd.release(), ec);
    } else {
      const auto address = asio::ip::make_address(o_.host, ec);
      if (ec) return InvalidArgument("--metrics-host '" + o_.host + "' is not an IP address");
      const tcp::endpoint at(address, o_.port);
      acceptor_.open(at.protocol(), ec);
      if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
      if (!ec) acceptor_.bind(at, ec);
    }
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return ListenError(o_.name + " at " + FormatEndpoint(o_.host, o_.port), ec.value());
    port_ = acceptor_.local_endpoint().port();
    Accept();
    return Status::Ok();
  }

  std::uint16_t port() const override { return port_; }
  std::string endpoint() const override { return FormatEndpoint(o_.host, port_); }
  std::string url() const override {
    return (o_.tls ? "https://" : "http://") + endpoint() + "/metrics";
  }

  void Stop() override {
    if (*stopped_) return;
    *stopped_ = true;
    beast::error_code ignored;
    acceptor_.close(ignored);
    auto open = std::move(open_);
    for (const auto& c : open) c->Close();
  }

  ~Server() override { Stop(); }

  HttpResponse Handle(const HttpRequest& r) { return handle_(r); }
  std::size_t body_limit() const { return o_.body_limit; }
  void Forget(const Connection* c) {
    std::erase_if(open_, [c](const auto& o) { return o.get() == c; });
  }

 private:
  Status MakeTlsContext(const TlsOptions& t) {
    tls_ = std::make_unique<ssl::context>(ssl::context::tls_server);
    tls_->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                      ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    beast::error_code ec;
    tls_->use_certificate_chain(asio::buffer(t.cert_pem), ec);
    if (ec) return InvalidArgument("metrics: the TLS certificate cannot be used: " + ec.message());
    tls_->use_private_key(asio::buffer(t.key_pem), ssl::context::pem, ec);
    if (ec) return InvalidArgument("metrics: the TLS key cannot be used: " + ec.message());
    if (!t.ca_pem.empty()) {
      tls_->add_certificate_authority(asio::buffer(t.ca_pem), ec);
      if (ec) return InvalidArgument("metrics: the TLS CA cannot be used: " + ec.message());
      tls_->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
    return Status::Ok();
  }

  static asio::ip::address Unmapped(const asio::ip::address& a) {
    if (a.is_v6() && a.to_v6().is_v4_mapped()) {
      return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    }
    return a;
  }

  bool Allowed(const tcp::socket& socket) const {
    if (allowed_.empty()) return true;
    beast::error_code ec;
    const auto peer = socket.remote_endpoint(ec);
    return !ec && allowed_.count(Unmapped(peer.address())) != 0;
  }

  void Accept() {
    acceptor_.async_accept([this, stopped = stopped_](beast::error_code ec, tcp::socket socket) {
      if (*stopped) return;
      if (!ec) {
        if (open_.size() >= o_.max_connections || !Allowed(socket)) {
          beast::error_code ignored;
          socket.close(ignored);  // full: refused at once
        } else {
          std::shared_ptr<Connection> c;
          if (tls_) {
            c = std::make_shared<ConnectionOf<beast::ssl_stream<beast::tcp_stream>>>(this, stopped_,
                                                                                     o_.io_timeout,
                                                                                     std::move(
                                                                                         socket),
                                                                                     *tls_);
          } else {
            c = std::make_shared<ConnectionOf<beast::tcp_stream>>(this, stopped_, o_.io_timeout,
                                                                  std::move(socket));
          }
          open_.insert(c);
          c->Run();
        }
      }
      // A failed accept (descriptors exhausted) is retried with the next connection.
      Accept();
    });
  }

  asio::io_context& io_;
  HttpServerOptions o_;
  std::function<HttpResponse(const HttpRequest&)> handle_;
  std::set<asio::ip::address> allowed_;
  tcp::acceptor acceptor_;
  std::unique_ptr<ssl::context> tls_;
  std::uint16_t port_ = 0;
  // Shared with every handler, which may run after the server is gone.
  std::shared_ptr<bool> stopped_ = std::make_shared<bool>(false);
  std::set<std::shared_ptr<Connection>> open_;
};

template <typename Stream>
void ConnectionOf<Stream>::Run() {
  if constexpr (kTls) {
    Arm();
    // A client that does not speak TLS fails the handshake and is closed.
    stream_.async_handshake(ssl::stream_base::server,
                            [self = this->shared_from_this()](beast::error_code ec) {
                              if (*self->stopped_) return;
                              if (ec) return self->Done();
                              self->Read();
                            });
  } else {
    Read();
  }
}

template <typename Stream>
void ConnectionOf<Stream>::Read() {
  parser_ = std::make_unique<bhttp::request_parser<bhttp::string_body>>();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(server_->body_limit());
  Arm();
  bhttp::async_read(stream_, buffer_, *parser_,
                    [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
                      if (*self->stopped_) return;
                      if (ec == bhttp::error::end_of_stream || ec == beast::error::timeout ||
                          ec == asio::error::connection_reset || ec == asio::error::eof ||
                          ec == ssl::error::stream_truncated) {
                        return self->Done();
                      }
                      if (ec) {
                        // Malformed or too large: say so once, then close.
                        const bool large = ec == bhttp::error::body_limit;
                        self->response_ = {large ? bhttp::status::payload_too_large
                                                 : bhttp::status::bad_request,
                                           11};
                        self->response_.set(bhttp::field::content_type, "text/plain");
                        self->response_.body() =
                            large ? "request body over " +
                                        std::to_string(self->server_->body_limit()) + " bytes\n"
                                  : "bad request: " + ec.message() + "\n";
                        self->response_.keep_alive(false);
                        self->response_.prepare_payload();
                        self->Arm();
                        return bhttp::async_write(self->stream_, self->response_,
                                                  [self](beast::error_code, std::size_t) {
                                                    self->Done();
                                                  });
                      }
                      self->Answer();
                    });
}

template <typename Stream>
void ConnectionOf<Stream>::Answer() {
  const auto& req = parser_->get();
  const bool head = req.method() == bhttp::verb::head;
  HttpResponse r =
      server_->Handle({std::string(req.method_string()), std::string(req.target()), req.body()});
  response_ = {static_cast<bhttp::status>(r.status), req.version()};
  response_.set(bhttp::field::server, "crun");
  if (!r.content_type.empty()) response_.set(bhttp::field::content_type, r.content_type);
  for (const auto& [name, value] : r.headers) response_.set(name, value);
  response_.body() = std::move(r.body);  // a page can be large (1,000 jobs: 667 KB)
  response_.keep_alive(req.keep_alive());
  response_.prepare_payload();
  if (head) response_.body().clear();  // the length stays the GET's
  Arm();
  bhttp::async_write(stream_, response_,
                     [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
                       if (*self->stopped_) return;
                       if (ec || !self->response_.keep_alive()) return self->Done();
                       self->Read();
                     });
}

template <typename Stream>
void ConnectionOf<Stream>::Done() {
  Close();
  if (!*stopped_) server_->Forget(this);
}

}  // namespace

Status HttpServerOptions::Validate() const {
  if (max_connections == 0) return InvalidArgument("metrics: max_connections must be at least 1");
  if (io_timeout.count() <= 0) return InvalidArgument("metrics: io_timeout must be positive");
  if (body_limit == 0) return InvalidArgument("HTTP server: body_limit must be at least 1");
  return Status::Ok();
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Serve(
    asio::io_context& io, const HttpServerOptions& options,
    std::function<HttpResponse(const HttpRequest&)> handle) {
  if (Status s = options.Validate(); !s.ok()) {
    UniqueFd owned(options.bound_fd);  // the server owned it
    return s;
  }
  auto server = std::make_unique<Server>(io, options, std::move(handle));
  CRUN_RETURN_IF_ERROR(server->Listen());
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace crun::http
