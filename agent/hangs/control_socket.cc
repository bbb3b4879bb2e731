#include "agent/hangs/control_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/spdlog.h>

namespace crun::agent {
namespace {

namespace asio = boost::asio;
using Local = asio::local::stream_protocol;

constexpr std::size_t kMaxRequest = 4096;

// One connection: read a line (within 5 s), check the peer, answer, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  // A copy of the handler: a session may outlive the server (crun ending while it answers).
  Session(asio::io_context& io, Local::socket socket, ControlServer::Handler handler)
      : socket_(std::move(socket)),
        timer_(io),
        handler_(std::move(handler)),
        request_(kMaxRequest) {}

  void Start() {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        (cred.uid != ::getuid() && cred.uid != 0)) {
      return Reply(R"({"error": "refused: not crun's user"})");
    }
    auto self = shared_from_this();
    timer_.expires_after(std::chrono::seconds(5));
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->Close();
    });
    asio::async_read_until(socket_, request_, '\n',
                           [self](const boost::system::error_code& ec, std::size_t n) {
                             self->timer_.cancel();
                             if (ec) return self->Close();
                             std::string line(asio::buffers_begin(self->request_.data()),
                                              asio::buffers_begin(self->request_.data()) +
                                                  static_cast<std::ptrdiff_t>(n - 1));
                             self->handler_(line, [self](std::string answer) {
                               self->Reply(std::move(answer));
                             });
                           });
  }

 private:
  void Reply(std::string answer) {
    answer_ = std::move(answer) + "\n";
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(answer_),
                      [self](const boost::system::error_code&, std::size_t) { self->Close(); });
  }
  void Close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  Local::socket socket_;
  asio::steady_timer timer_;
  ControlServer::Handler handler_;
  asio::streambuf request_;
  std::string answer_;
};

}  // namespace

std::string ControlSocketName(pid_t pid) {
  return std::string(1, '\0') + "crun/" + std::to_string(pid) + "/control";
}

StatusOr<std::unique_ptr<ControlServer>> ControlServer::Listen(asio::io_context& io,
                                                               Handler handler) {
  auto server = std::unique_ptr<ControlServer>(new ControlServer(io, std::move(handler)));
  boost::system::error_code ec;
  const Local::endpoint at(ControlSocketName(::getpid()));
  server->acceptor_.open(at.protocol(), ec);
  if (!ec) server->acceptor_.bind(at, ec);
  if (!ec) server->acceptor_.listen(16, ec);
  if (ec) return Unavailable("cannot listen on crun's control socket: " + ec.message());
  server->Accept();
  return server;
}

ControlServer::ControlServer(asio::io_context& io, Handler handler)
    : io_(io), acceptor_(io), handler_(std::move(handler)) {}

ControlServer::~ControlServer() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

void ControlServer::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, Local::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) std::make_shared<Session>(io_, std::move(socket), handler_)->Start();
    Accept();
  });
}

StatusOr<std::string> AskControl(pid_t pid, const std::string& request,
                                 std::chrono::milliseconds timeout) {
  const std::string who = "crun (pid " + std::to_string(pid) + ")";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("socket", errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = ControlSocketName(pid);
  std::memcpy(addr.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == ECONNREFUSED || err == ENOENT) {
      return NotFound(who +
                      " is not running here, or is not a crun launcher with workers "
                      "(no control socket; crun stacks must run on the same host and "
                      "network namespace)");
    }
    return PosixError("cannot reach " + who, err);
  }
  const std::string line = request + "\n";
  if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    const int err = errno;
    ::close(fd);
    return PosixError("cannot ask " + who, err);
  }
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      ::close(fd);
      return TimeoutError(who + " did not answer within " + std::to_string(timeout.count() / 1000) +
                          " s");
    }
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    answer.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (answer.empty()) return Unavailable(who + " closed the connection without an answer");
  return answer;
}

}  // namespace crun::agent
