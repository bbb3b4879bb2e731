#include "metrics/endpoint.h"

#include "metrics/exposition.h"

namespace crun::metrics {
namespace {

http::HttpResponse Answer(const std::function<std::string()>& page, const Pages* pages,
                          const http::HttpRequest& req) {
  std::string target = req.target;
  std::string query;
  if (auto q = target.find('?'); q != std::string::npos) {
    query = target.substr(q + 1);
    target.resize(q);
  }
  const auto other = pages != nullptr ? pages->find(target) : Pages::const_iterator{};
  const bool is_other = pages != nullptr && other != pages->end();
  http::HttpResponse r;
  if (target != "/metrics" && target != "/" && !is_other) {
    r.status = 404;
    r.body = "not found: crun serves /metrics\n";
  } else if (req.method != "GET" && req.method != "HEAD") {
    r.status = 405;
    r.headers = {{"Allow", "GET, HEAD"}};
    r.body = "method not allowed: GET or HEAD\n";
  } else if (is_other) {
    r = other->second(query);
  } else if (target == "/") {
    r.body = "crun: metrics at /metrics\n";
  } else {
    r.content_type = kContentType;
    r.body = page();
  }
  return r;
}

}  // namespace

StatusOr<std::unique_ptr<http::HttpServer>> ServeMetrics(boost::asio::io_context& io,
                                                         const http::HttpServerOptions& options,
                                                         std::function<std::string()> page,
                                                         const Pages* pages) {
  return http::HttpServer::Serve(io, options,
                                 [page = std::move(page), pages](const http::HttpRequest& req) {
                                   return Answer(page, pages, req);
                                 });
}

}  // namespace crun::metrics
