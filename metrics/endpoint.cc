#include "metrics/endpoint.h"

#include "metrics/exposition.h"

namespace crun::metrics {

StatusOr<std::unique_ptr<http::HttpServer>> ServeMetrics(boost::asio::io_context& io,
                                                         const http::HttpServerOptions& options,
                                                         std::function<std::string()> page) {
  return http::HttpServer::Serve(io, options,
                                 [page = std::move(page)](const http::HttpRequest& req) {
                                   std::string target = req.target;
                                   if (auto q = target.find('?'); q != std::string::npos)
                                     target.resize(q);
                                   http::HttpResponse r;
                                   if (target != "/metrics" && target != "/") {
                                     r.status = 404;
                                     r.body = "not found: crun serves /metrics\n";
                                   } else if (req.method != "GET" && req.method != "HEAD") {
                                     r.status = 405;
                                     r.headers = {{"Allow", "GET, HEAD"}};
                                     r.body = "method not allowed: GET or HEAD\n";
                                   } else if (target == "/") {
                                     r.body = "crun: metrics at /metrics\n";
                                   } else {
                                     r.content_type = kContentType;
                                     r.body = page();
                                   }
                                   return r;
                                 });
}

}  // namespace crun::metrics
