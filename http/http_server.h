// crun's HTTP/1.1 server on Boost.Beast (HTTPS with TlsOptions), serving one handler: the
// /metrics endpoint (metrics/endpoint.h) and Horovod's rendezvous (agent/frameworks/horovod_kv.h).
// A malformed request is answered 400, a body over body_limit 413, and the connection closed. Each
// read and write has a deadline, and at most `max_connections` are open at once (the others are
// closed on accept), as are connections from addresses not in `allowed_peers` when it is set, so
// that a slow or hostile client costs a descriptor for a bounded time and nothing more. Runs on the
// io_context it is given; Serve and Stop on its thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "base/status.h"

namespace crun::http {

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
  // A TCP socket already bound (a port reserved for this server): listened on, and owned, by
  // the server instead of binding host:port.
  int bound_fd = -1;
  std::size_t max_connections = 64;
  std::chrono::milliseconds io_timeout{10'000};
  std::size_t body_limit = 4 * 1024;
  // Client addresses (IP literals) that may connect; empty: any.
  std::vector<std::string> allowed_peers;
  std::optional<TlsOptions> tls;  // plain HTTP without
  std::string name = "metrics";   // in errors: "cannot listen on metrics at 127.0.0.1:9400"

  Status Validate() const;
};

struct HttpRequest {
  std::string method;  // "GET", "PUT", ...
  std::string target;  // "/global/rank_0", query included
  std::string body;
};

struct HttpResponse {
  unsigned status = 200;
  std::string body;
  std::string content_type = "text/plain";
  std::vector<std::pair<std::string, std::string>> headers;
};

class HttpServer {
 public:
  // Every request to `handle`, called on the io_context's thread. A HEAD request's answer is
  // the handler's without its body.
  static StatusOr<std::unique_ptr<HttpServer>> Serve(
      boost::asio::io_context& io, const HttpServerOptions& options,
      std::function<HttpResponse(const HttpRequest&)> handle);
  virtual ~HttpServer() = default;
  virtual std::uint16_t port() const = 0;
  // "127.0.0.1:9400"
  virtual std::string endpoint() const = 0;
  // "http://127.0.0.1:9400/metrics", or https:// with TLS.
  virtual std::string url() const = 0;
  // Closes the listening socket and every connection. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace crun::http
