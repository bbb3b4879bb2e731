// The /metrics endpoint over real sockets: what a scraper gets, and what a bad client gets
// (404, 405, 400 and closed, closed when idle or when the server is full).
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>

#include "base/socket.h"
#include "http/http_server.h"
#include "metrics/endpoint.h"
#include "metrics/exposition.h"

namespace {

using namespace std::chrono_literals;
using crun::http::HttpServer;
using crun::http::HttpServerOptions;

// A server on its own thread, serving a fixed page and counting scrapes.
struct Served {
  explicit Served(HttpServerOptions o = {}) {
    auto s = crun::metrics::ServeMetrics(io, o, [this] {
      ++scrapes;
      return std::string("crun_up 1\n");
    });
    REQUIRE(s.ok());
    server = std::move(s).value();
    thread = std::thread([this] { io.run(); });
  }
  ~Served() {
    boost::asio::post(io, [this] { server->Stop(); });
    work.reset();
    thread.join();
  }
  crun::UniqueFd Connect() {
    auto fd = crun::ConnectTcp("127.0.0.1", server->port(), crun::DeadlineAfter(5s));
    REQUIRE(fd.ok());
    return std::move(fd).value();
  }
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{
      boost::asio::make_work_guard(io)};
  std::unique_ptr<HttpServer> server;
  std::thread thread;
  std::atomic<int> scrapes{0};
};

// Everything the server sends until it closes the connection (or 5 s pass: a failure).
std::string ReadToClose(int fd) {
  std::string got;
  char buf[4096];
  const auto deadline = crun::DeadlineAfter(5s);
  while (true) {
    auto n = crun::RecvSome(fd, buf, 1, sizeof buf, deadline, "metrics");
    if (!n.ok()) {
      REQUIRE(n.status().code() == crun::StatusCode::kUnavailable);  // closed, not timed out
      return got;
    }
    got.append(buf, *n);
  }
}

std::string Ask(Served& s, const std::string& request) {
  auto fd = s.Connect();
  REQUIRE(crun::SendAll(fd.get(), request, crun::DeadlineAfter(5s), "metrics").ok());
  return ReadToClose(fd.get());
}

}  // namespace

TEST_CASE("metrics endpoint: GET /metrics is the page in Prometheus's format") {
  Served s;
  const auto r = Ask(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(r.find(std::string("Content-Type: ") + crun::metrics::kContentType) != std::string::npos);
  CHECK(r.find("Content-Length: 10\r\n") != std::string::npos);
  CHECK(r.substr(r.size() - 10) == "crun_up 1\n");
  CHECK(s.scrapes == 1);
  CHECK(s.server->endpoint() == "127.0.0.1:" + std::to_string(s.server->port()));
}

TEST_CASE("metrics endpoint: HEAD, keep-alive, a query string, other paths and methods") {
  Served s;
  auto head = Ask(s, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(head.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(head.find("Content-Length: 10\r\n") != std::string::npos);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");  // no body
  // Two scrapes on one connection, the second closing it.
  auto both = Ask(s,
                  "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                  "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(both.find("HTTP/1.1 200 OK") != both.rfind("HTTP/1.1 200 OK"));
  CHECK(Ask(s, "GET /secret HTTP/1.1\r\nConnection: close\r\n\r\n")
            .rfind("HTTP/1.1 404 Not Found\r\n", 0) == 0);
  auto post = Ask(s, "POST /metrics HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab");
  CHECK(post.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0) == 0);
  CHECK(post.find("Allow: GET, HEAD\r\n") != std::string::npos);
}

TEST_CASE("metrics endpoint: garbage and oversized requests get 400 (a body 413), then closed") {
  Served s;
  CHECK(Ask(s, std::string("\x16\x03\x01\x02\x00garbage\r\n\r\n", 17))
            .rfind("HTTP/1.1 400 Bad Request\r\n", 0) == 0);
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n";
  CHECK(Ask(s, huge).rfind("HTTP/1.1 400 Bad Request\r\n", 0) == 0);
  const std::string body =
      "POST / HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + std::string(100000, 'b');
  const std::string answer = Ask(s, body);
  CHECK(answer.rfind("HTTP/1.1 413 Payload Too Large\r\n", 0) == 0);
  CHECK(answer.find("request body over 4096 bytes") != std::string::npos);
  CHECK(s.scrapes == 0);
}

TEST_CASE("metrics endpoint: an idle client is closed at the deadline, the full server refuses") {
  HttpServerOptions o;
  o.io_timeout = 300ms;
  o.max_connections = 2;
  Served s(o);
  auto a = s.Connect();
  auto b = s.Connect();
  // Both slots taken (each accepted by now: a third is refused once they are open).
  auto c = s.Connect();
  CHECK(ReadToClose(c.get()).empty());  // closed at once, not after the deadline
  CHECK(ReadToClose(a.get()).empty());  // idle: closed by the deadline
  CHECK(ReadToClose(b.get()).empty());
  // Room again.
  CHECK(Ask(s, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
            .rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
}

TEST_CASE("metrics endpoint: a port in use and a bad host are refused, naming them") {
  boost::asio::io_context io;
  HttpServerOptions o;
  auto first = crun::metrics::ServeMetrics(io, o, [] { return std::string(); });
  REQUIRE(first.ok());
  o.port = (*first)->port();
  auto second = crun::metrics::ServeMetrics(io, o, [] { return std::string(); });
  REQUIRE(!second.ok());
  CHECK(second.status().message().find("127.0.0.1:" + std::to_string(o.port)) != std::string::npos);
  o.port = 0;
  o.host = "not-an-address";
  auto bad = crun::metrics::ServeMetrics(io, o, [] { return std::string(); });
  REQUIRE(!bad.ok());
  CHECK(bad.status().message() == "--metrics-host 'not-an-address' is not an IP address");
}

TEST_CASE("http server: an address off the allow-list is closed at accept", "[metrics]") {
  HttpServerOptions o;
  o.allowed_peers = {"10.9.9.9"};
  Served off(o);
  auto c = off.Connect();
  CHECK(ReadToClose(c.get()).empty());
  CHECK(off.scrapes == 0);
  o.allowed_peers = {"10.9.9.9", "127.0.0.1"};
  Served on(o);
  CHECK(Ask(on, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
}

TEST_CASE("http server: listens on a socket bound before, keeping its port", "[metrics]") {
  crun::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0);
  HttpServerOptions o;
  o.bound_fd = fd.release();
  Served s(o);
  CHECK(s.server->port() == ntohs(a.sin_port));
  CHECK(Ask(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
}
