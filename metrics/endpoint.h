// The /metrics endpoint (--metrics-port, --metrics-host): the page a Registry renders in
// Prometheus's text format, on GET or HEAD /metrics (anything else 404 or 405), through crun's
// HTTP server (http/http_server.h) with its limits, deadlines and TLS.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

#include "base/status.h"
#include "http/http_server.h"

namespace crun::metrics {

// Pages beside /metrics, by path ("/goodput"): each answers a GET or HEAD with the request's
// query string ("run_id=abc", "" for none). Looked up at each request: a page added after the
// endpoint started is served.
using Pages = std::map<std::string, std::function<http::HttpResponse(const std::string& query)>>;

// `page` is called on the io_context's thread for each scrape, as `pages`' are for theirs.
StatusOr<std::unique_ptr<http::HttpServer>> ServeMetrics(boost::asio::io_context& io,
                                                         const http::HttpServerOptions& options,
                                                         std::function<std::string()> page,
                                                         const Pages* pages = nullptr);

}  // namespace crun::metrics
