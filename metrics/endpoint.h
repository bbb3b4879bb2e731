// The /metrics endpoint (--metrics-port, --metrics-host): the page a Registry renders in
// Prometheus's text format, on GET or HEAD /metrics (anything else 404 or 405), through crun's
// HTTP server (http/http_server.h) with its limits, deadlines and TLS.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

#include "base/status.h"
#include "http/http_server.h"

namespace crun::metrics {

// `page` is called on the io_context's thread for each scrape.
StatusOr<std::unique_ptr<http::HttpServer>> ServeMetrics(boost::asio::io_context& io,
                                                         const http::HttpServerOptions& options,
                                                         std::function<std::string()> page);

}  // namespace crun::metrics
