// The /metrics endpoint (--metrics-port, --metrics-host): HTTP/1.1 on Boost.Beast, HTTPS with
// TlsOptions, serving the page a Registry renders in Prometheus's text format. GET or HEAD
// /metrics; anything else is answered 404 or 405, a malformed or oversized request 400, and the
// connection closed. Each read and write has a deadline, and at most `max_connections` are open at
// once (the others are closed on accept), so that a slow or hostile client costs a descriptor for a
// bounded time and nothing more. Runs on the io_context it is given; Start and Stop on its thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>

#include "base/status.h"

namespace crun::metrics {

// HTTPS: the server's certificate (chain) and key in PEM; with a CA, clients must present a
// certificate it signed (mutual TLS), as the rendezvous service asks of its agents.
struct TlsOptions {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  std::uint16_t port = 0;          // 0: any free port (read it back with port())
  std::size_t max_connections = 64;
  std::chrono::milliseconds io_timeout{10'000};
  std::optional<TlsOptions> tls;  // plain HTTP without

  Status Validate() const;
};

class HttpServer {
 public:
  // `page` is called on the io_context's thread for each scrape.
  static StatusOr<std::unique_ptr<HttpServer>> Start(boost::asio::io_context& io,
                                                     const HttpServerOptions& options,
                                                     std::function<std::string()> page);
  virtual ~HttpServer() = default;
  virtual std::uint16_t port() const = 0;
  // "127.0.0.1:9400"
  virtual std::string endpoint() const = 0;
  // "http://127.0.0.1:9400/metrics", or https:// with TLS.
  virtual std::string url() const = 0;
  // Closes the listening socket and every connection. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace crun::metrics
