#include "rendezvous/store_server/store_server.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <fstream>
#include <future>
#include <unordered_map>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "base/log_sampling.h"
#include "base/socket.h"
#include "rendezvous/store_server/session.h"

namespace crun {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using server_detail::ServerShared;
using server_detail::Session;

// Accepts per readiness event before the loop serves established connections again.
constexpr int kAcceptsPerWake = 256;

int SystemBacklog() {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  int value = 0;
  if (in >> value && value > 0) return value;
  return SOMAXCONN;
}

std::string DescriptorLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(rl.rlim_cur);
}

StatusOr<asio::ip::address> ResolveBindAddress(asio::io_context& io, const std::string& host) {
  boost::system::error_code ec;
  auto literal = asio::ip::make_address(host, ec);
  if (!ec) return literal;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, "0", tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    return InvalidArgument("cannot resolve store bind host '" + host +
                           "': " + (ec ? ec.message() : std::string("no addresses")));
  }
  return results.begin()->endpoint().address();
}

// "store: cannot listen on 127.0.0.1:29500: the address is in use ...": ListenError's code.
Status StoreListenError(const std::string& where, const boost::system::error_code& ec) {
  const Status s = ListenError(where, ec.value());
  return Status(s.code(), "store: " + s.message());
}

class AsioStoreServer final : public StoreServer {
 public:
  AsioStoreServer(asio::io_context& io, const StoreServerOptions& options)
      : io_(io), options_(options), shared_(std::make_shared<ServerShared>(options.limits)) {}

  ~AsioStoreServer() override { Stop(); }

  Status Listen() {
    auto address = ResolveBindAddress(io_, options_.host);
    if (!address.ok()) return address.status();
    tcp::endpoint ep(*address, options_.port);
    const std::string where = FormatEndpoint(address->to_string(), options_.port);
    const int backlog = options_.backlog > 0 ? options_.backlog : SystemBacklog();
    const int sockets = ListenSockets(backlog);
    if (sockets > 1 && ep.port() != 0) {
      // The port must be free: a plain socket (no SO_REUSEPORT) binds it only then. Without
      // this, a second server on the port would join this one's group instead of failing.
      tcp::acceptor probe(io_);
      if (auto s = Bind(probe, ep, false, where); !s.ok()) return s;
    }
    for (int i = 0; i < sockets; ++i) {
      auto acceptor = std::make_unique<tcp::acceptor>(io_);
      const tcp::endpoint at = i == 0 ? ep : tcp::endpoint(ep.address(), port_);
      if (auto s = Bind(*acceptor, at, sockets > 1, where); !s.ok()) return s;
      boost::system::error_code ec;
      acceptor->listen(backlog, ec);
      if (ec) return StoreListenError(where, ec);
      acceptor->non_blocking(true, ec);
      ::fcntl(acceptor->native_handle(), F_SETFD, FD_CLOEXEC);
      if (i == 0) port_ = acceptor->local_endpoint().port();
      acceptors_.push_back(std::move(acceptor));
    }
    endpoint_ = FormatEndpoint(address->to_string(), port_);
    max_connections_ = options_.max_connections;
    shared_->name = "store " + endpoint_;
    shared_->on_close = [this](Session* s) { OnSessionClosed(s); };
    for (const auto& a : options_.allowed_peers) {
      boost::system::error_code bad;
      auto parsed = asio::ip::make_address(a, bad);
      if (bad) return InvalidArgument("store: allowed peer '" + a + "' is not an IP address");
      allowed_.insert(parsed.to_string());
    }
    reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    spdlog::info("{}: listening ({} x backlog {}, {} connections, descriptor limit {})",
                 shared_->name, sockets, backlog,
                 max_connections_ > 0 ? "up to " + std::to_string(max_connections_) : "unlimited",
                 DescriptorLimit());
    for (auto& a : acceptors_) ArmAccept(*a);
    return Status::Ok();
  }

  void Stop() override {
    if (stopped_) return;
    stopped_ = true;
    boost::system::error_code ec;
    for (auto& a : acceptors_) a->close(ec);
    auto sessions = std::move(sessions_);
    sessions_.clear();
    for (auto& [raw, session] : sessions) session->Close();
    // Sessions outlive the server until their aborted handlers have run: none may call back.
    shared_->on_close = nullptr;
    if (reserve_fd_ >= 0) ::close(reserve_fd_);
    reserve_fd_ = -1;
  }

  std::uint16_t port() const override { return port_; }
  std::string endpoint() const override { return endpoint_; }
  std::size_t max_connections() const override { return max_connections_; }

  StoreServerStats stats() const override {
    StoreServerStats s;
    s.open_connections = shared_->open.load(std::memory_order_relaxed);
    s.accepted = accepted_.load(std::memory_order_relaxed);
    s.refused = refused_.load(std::memory_order_relaxed);
    s.refused_per_peer = refused_per_peer_.load(std::memory_order_relaxed);
    s.refused_strangers = refused_strangers_.load(std::memory_order_relaxed);
    s.protocol_errors = shared_->protocol_errors.load(std::memory_order_relaxed);
    s.requests = shared_->requests.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < wire::kCommandCount; ++i) {
      s.requests_by_command[i] = shared_->by_command[i].load(std::memory_order_relaxed);
    }
    s.pending_waits = shared_->state.pending_waits();
    s.stored_bytes = shared_->state.bytes();
    s.read_pauses = shared_->read_pauses.load(std::memory_order_relaxed);
    return s;
  }

 private:
  // Opens `acceptor` and binds it to `ep` (with SO_REUSEPORT when `share_port`); "::" serves
  // IPv4 too.
  static Status Bind(tcp::acceptor& acceptor, const tcp::endpoint& ep, bool share_port,
                     const std::string& where) {
    boost::system::error_code ec;
    acceptor.open(ep.protocol(), ec);
    if (ec) return Unavailable("store: cannot open a socket for " + where + ": " + ec.message());
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (ep.address().is_v6() && ep.address().to_v6().is_unspecified()) {
      acceptor.set_option(asio::ip::v6_only(false), ec);
    }
    if (share_port) {
      const int on = 1;
      ::setsockopt(acceptor.native_handle(), SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
    }
    acceptor.bind(ep, ec);
    return ec ? StoreListenError(where, ec) : Status::Ok();
  }

  // Listening sockets of one port (SO_REUSEPORT), each with its own accept queue of `backlog`:
  // enough queue for every connection the server may hold, so that a storm of them is not
  // dropped (and retried by the clients a second later) while the server catches up. At most
  // 16; one when a single queue suffices.
  int ListenSockets(int backlog) const {
    std::uint64_t capacity = options_.expected_connections;
    if (capacity == 0) capacity = options_.max_connections;
    if (capacity == 0) {
      rlimit rl{};
      capacity = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur
                                                                                      : 1'000'000;
    }
    const std::uint64_t per = static_cast<std::uint64_t>(std::max(backlog, 1));
    return static_cast<int>(std::clamp<std::uint64_t>((capacity + per - 1) / per, 1, 16));
  }

  void ArmAccept(tcp::acceptor& acceptor) {
    acceptor.async_wait(tcp::acceptor::wait_read, [this,
                                                   &acceptor](const boost::system::error_code& ec) {
      if (ec) {
        if (ec != asio::error::operation_aborted) {
          spdlog::error("{}: accept wait failed: {}", shared_->name, ec.message());
        }
        return;
      }
      OnAcceptable(acceptor);
    });
  }

  void OnAcceptable(tcp::acceptor& acceptor) {
    bool drained = false;
    for (int i = 0; i < kAcceptsPerWake && !stopped_; ++i) {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor.accept(socket, ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) {
        drained = true;
        break;
      }
      if (ec == asio::error::no_descriptors || ec.value() == ENFILE) {
        RefuseAtDescriptorLimit(acceptor);
        continue;
      }
      if (ec) {
        // ECONNABORTED and friends: that one client gave up; keep serving the rest.
        spdlog::debug("{}: accept failed: {}", shared_->name, ec.message());
        continue;
      }
      accepted_.fetch_add(1, std::memory_order_relaxed);
      if (max_connections_ > 0 && sessions_.size() >= max_connections_) {
        Refuse(std::move(socket), refused_,
               "(connection limit of " + std::to_string(max_connections_) + "; " +
                   std::to_string(sessions_.size()) + " open)");
        continue;
      }
      const std::string peer = PeerAddress(socket);
      if (!allowed_.empty() && allowed_.count(peer) == 0) {
        Refuse(std::move(socket), refused_strangers_,
               "from " + peer + ": not an address of this job's nodes");
        continue;
      }
      if (options_.max_connections_per_peer > 0 &&
          per_peer_[peer] >= options_.max_connections_per_peer) {
        Refuse(std::move(socket), refused_per_peer_,
               "from " + peer + ": it has " + std::to_string(options_.max_connections_per_peer) +
                   " open, the limit per address");
        continue;
      }
      ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
      auto session = std::make_shared<Session>(std::move(socket), shared_);
      ++per_peer_[peer];
      session_peer_[session.get()] = peer;
      sessions_.emplace(session.get(), session);
      session->Start();
    }
    if (stopped_) return;
    if (drained) {
      ArmAccept(acceptor);
    } else {
      // The budget ran out with connections still queued: let established connections have a
      // turn, then go on accepting without first waiting for readiness.
      asio::post(io_, [this, &acceptor] {
        if (!stopped_) OnAcceptable(acceptor);
      });
    }
  }

  // The client's IP address as the allow-list spells it: IPv4 clients of a dual-stack socket
  // as plain IPv4.
  static std::string PeerAddress(const tcp::socket& socket) {
    boost::system::error_code ec;
    const auto remote = socket.remote_endpoint(ec);
    if (ec) return "?";
    auto a = remote.address();
    if (a.is_v6() && a.to_v6().is_v4_mapped()) {
      a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    }
    return a.to_string();
  }

  void OnSessionClosed(Session* s) {
    sessions_.erase(s);
    auto it = session_peer_.find(s);
    if (it == session_peer_.end()) return;
    auto count = per_peer_.find(it->second);
    if (count != per_peer_.end() && --count->second == 0) per_peer_.erase(count);
    session_peer_.erase(it);
  }

  // Closes a connection refused on accept, counts it in `counter` and logs it (sampled).
  void Refuse(tcp::socket socket, std::atomic<std::uint64_t>& counter, const std::string& why) {
    const auto n = counter.fetch_add(1, std::memory_order_relaxed) + 1;
    boost::system::error_code ec;
    socket.close(ec);
    LogRefusal(n, why);
  }

  // accept() failed with EMFILE: give up the reserve descriptor, take the waiting connection
  // and close it, so the client hears "no" instead of hanging in the backlog.
  void RefuseAtDescriptorLimit(tcp::acceptor& acceptor) {
    if (reserve_fd_ >= 0) {
      ::close(reserve_fd_);
      reserve_fd_ = -1;
    }
    const int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) ::close(fd);
    reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const auto n = refused_.fetch_add(1, std::memory_order_relaxed) + 1;
    LogRefusal(n, "(process descriptor limit; " + std::to_string(sessions_.size()) + " open)");
  }

  void LogRefusal(std::uint64_t n, const std::string& why) {
    if (WorthLogging(n)) spdlog::warn("{}: refused connection #{} {}", shared_->name, n, why);
  }

  asio::io_context& io_;
  StoreServerOptions options_;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors_;
  std::shared_ptr<ServerShared> shared_;  // and every session (session.h)
  std::unordered_map<Session*, std::shared_ptr<Session>> sessions_;
  std::uint16_t port_ = 0;
  std::string endpoint_;
  std::size_t max_connections_ = 0;
  int reserve_fd_ = -1;
  bool stopped_ = false;
  std::atomic<std::uint64_t> accepted_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> refused_per_peer_{0};
  std::atomic<std::uint64_t> refused_strangers_{0};
  std::unordered_set<std::string> allowed_;                // empty: everyone
  std::unordered_map<std::string, std::size_t> per_peer_;  // open connections per address
  std::unordered_map<Session*, std::string> session_peer_;
};

}  // namespace

std::string FormatStats(const StoreServerStats& s) {
  return std::to_string(s.open_connections) + " open, " + std::to_string(s.accepted) +
         " accepted, " + std::to_string(s.refused) + " refused at a limit, " +
         std::to_string(s.refused_per_peer) + " refused per address, " +
         std::to_string(s.refused_strangers) + " refused strangers, " +
         std::to_string(s.protocol_errors) + " closed for protocol errors, " +
         std::to_string(s.requests) + " requests, " + std::to_string(s.pending_waits) +
         " waits pending, " + std::to_string(s.stored_bytes) + " bytes stored, " +
         std::to_string(s.read_pauses) + " read pauses";
}

Status StoreServerOptions::Validate() const {
  if (host.empty()) return InvalidArgument("store bind host is empty");
  if (limits.max_key_bytes == 0) return InvalidArgument("max key bytes must be positive");
  if (limits.max_value_bytes == 0) return InvalidArgument("max value bytes must be positive");
  if (limits.max_keys_per_request == 0) {
    return InvalidArgument("max keys per request must be positive");
  }
  if (limits.max_request_bytes < limits.max_key_bytes + limits.max_value_bytes) {
    return InvalidArgument("max request bytes (" + std::to_string(limits.max_request_bytes) +
                           ") must be >= max key bytes + max value bytes (" +
                           std::to_string(limits.max_key_bytes + limits.max_value_bytes) + ")");
  }
  if (limits.max_waits_per_connection == 0) {
    return InvalidArgument("max waits per connection must be positive");
  }
  if (limits.max_pending_waits == 0) return InvalidArgument("max pending waits must be positive");
  if (backlog < 0) return InvalidArgument("backlog " + std::to_string(backlog) + " is negative");
  return Status::Ok();
}

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(asio::io_context& io,
                                                          const StoreServerOptions& options) {
  CRUN_RETURN_IF_ERROR(options.Validate());
  auto server = std::make_unique<AsioStoreServer>(io, options);
  CRUN_RETURN_IF_ERROR(server->Listen());
  return std::unique_ptr<StoreServer>(std::move(server));
}

StatusOr<std::unique_ptr<BackgroundStoreServer>> BackgroundStoreServer::Start(
    const StoreServerOptions& options) {
  std::unique_ptr<BackgroundStoreServer> bg(new BackgroundStoreServer());
  auto server = StoreServer::Start(bg->io_, options);
  if (!server.ok()) return server.status();
  bg->server_ = std::move(server).value();
  bg->port_ = bg->server_->port();
  bg->endpoint_ = bg->server_->endpoint();
  bg->thread_ = std::thread([io = &bg->io_] { io->run(); });
  return bg;
}

StoreServerStats BackgroundStoreServer::stats() {
  if (io_.stopped()) return server_->stats();  // the loop is gone: nothing else touches it
  std::promise<StoreServerStats> result;
  asio::post(io_, [&] { result.set_value(server_->stats()); });
  return result.get_future().get();
}

BackgroundStoreServer::~BackgroundStoreServer() {
  if (thread_.joinable()) {
    asio::post(io_, [this] { server_->Stop(); });
    thread_.join();
  }
  server_.reset();
}

std::uint64_t RaiseDescriptorLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

}  // namespace crun
