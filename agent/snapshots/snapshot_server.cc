#include "agent/snapshots/snapshot_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <spdlog/spdlog.h>

#include "base/numbers.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;
using Local = asio::local::stream_protocol;

constexpr std::size_t kMaxRequest = 256;
constexpr int kMaxLocalRank = 1 << 16;

// Sends `line` with `fds` attached; false when the peer cannot take it now (it then loses
// the connection: a worker that does not read its answers is broken).
bool SendWithFds(int sock, const std::string& line, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(line.data()), line.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * (fds.empty() ? 1 : fds.size())));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(line.size());
  }
}

struct Request {
  std::string verb;
  int local_rank = -1;
  int index = -1;
  std::uint64_t bytes = 0;
};

StatusOr<Request> ParseRequest(const std::string& line) {
  std::istringstream in(line);
  std::string rank, index, bytes;
  Request r;
  in >> r.verb >> rank >> index >> bytes;
  const auto bad = [&] { return InvalidArgument("malformed snapshot request '" + line + "'"); };
  const auto l = ParseInteger(rank, 0, kMaxLocalRank);
  if (!l) return bad();
  r.local_rank = static_cast<int>(*l);
  if (r.verb == "load" || r.verb == "open") return index.empty() ? StatusOr<Request>(r) : bad();
  const auto i = ParseInteger(index, 0, 1);
  if (!i) return bad();
  r.index = static_cast<int>(*i);
  if (r.verb == "saved" || r.verb == "verify") return bytes.empty() ? StatusOr<Request>(r) : bad();
  if (r.verb != "reserve") return bad();
  const auto b = ParseInteger(bytes, 0, INT64_MAX);
  if (!b) return bad();
  r.bytes = static_cast<std::uint64_t>(*b);
  return r;
}

}  // namespace

std::string SnapshotSocketName(pid_t pid) { return "@crun/" + std::to_string(pid) + "/snapshots"; }

SerialWorker::SerialWorker()
    : thread_([this] {
        for (;;) {
          std::function<void()> job;
          {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
            if (jobs_.empty()) return;  // stopping, and nothing is left
            job = std::move(jobs_.front());
            jobs_.pop_front();
          }
          job();
        }
      }) {}

SerialWorker::~SerialWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void SerialWorker::Post(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

// One worker's connection, for as long as the worker keeps it.
class SnapshotServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(SnapshotServer& server, Local::socket socket)
      : server_(server), alive_(server.alive_), socket_(std::move(socket)), in_(kMaxRequest) {}

  void Start() {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        (cred.uid != ::getuid() && cred.uid != 0)) {
      Reply("error refused: not crun's user", {});
      return Close();
    }
    pid_ = cred.pid;
    Read();
  }

 private:
  void Read() {
    auto self = shared_from_this();
    asio::async_read_until(socket_, in_, '\n',
                           [self](const boost::system::error_code& ec, std::size_t n) {
                             if (ec || !*self->alive_) return self->Close();
                             std::string line(asio::buffers_begin(self->in_.data()),
                                              asio::buffers_begin(self->in_.data()) +
                                                  static_cast<std::ptrdiff_t>(n - 1));
                             self->in_.consume(n);
                             self->Handle(line);
                           });
  }

  void Handle(const std::string& line) {
    auto request = ParseRequest(line);
    if (!request.ok()) {
      Reply("error " + request.status().message(), {});
      return Read();
    }
    const Request r = *request;
    if (r.verb == "reserve") {
      auto buffer = server_.memory_.Reserve(r.local_rank, r.index, r.bytes);
      if (!buffer.ok()) {
        ++server_.counters_.refusals;
        spdlog::error("crun: snapshot refused (worker pid {}): {}", pid_,
                      buffer.status().message());
        Reply("error " + buffer.status().message(), {});
      } else {
        Reply("ok " + std::to_string((*buffer)->capacity()), {(*buffer)->fd()});
      }
      Changed();
      return Read();
    }
    if (r.verb == "saved") {
      ++server_.counters_.saves;
      server_.QueueSeal(r.local_rank, r.index);
      Changed();
      return Read();
    }
    if (r.verb == "verify") return Verify(r.local_rank, r.index);
    if (r.verb == "open") return Answer(r.local_rank, server_.memory_.Slot(r.local_rank), {});
    Load(r.local_rank);
  }

  // Checked on the rank's sealer thread, answered back on the loop.
  void Verify(int local_rank, int index) {
    auto self = shared_from_this();
    NodeSnapshots& memory = server_.memory_;
    asio::io_context& io = server_.io_;
    server_.SealerOf(local_rank).Post([self, &memory, &io, local_rank, index] {
      const BufferCheck check = memory.Verify(local_rank, index);
      asio::post(io, [self, check, local_rank] {
        if (!*self->alive_) return self->Close();
        self->NoteCorrupt(check, local_rank);
        self->Reply(std::string("ok ") + Name(check.verdict), {});
        self->Changed();
        self->Read();
      });
    });
  }

  void NoteCorrupt(const BufferCheck& check, int local_rank) {
    if (check.verdict != BufferVerdict::kCorrupt) return;
    ++server_.counters_.corrupt;
    spdlog::error(
        "crun: the snapshot of rank {} (local rank {}) at step {} fails its checksum: it is not "
        "loaded",
        check.rank, local_rank, check.step);
  }

  void Load(int local_rank) {
    auto self = shared_from_this();
    NodeSnapshots& memory = server_.memory_;
    asio::io_context& io = server_.io_;
    server_.SealerOf(local_rank).Post([self, &memory, &io, local_rank] {
      const auto slot = memory.Slot(local_rank);  // held while the answer is on its way
      const auto checks = memory.Check(local_rank);
      asio::post(io, [self, slot, checks, local_rank] {
        if (!*self->alive_) return self->Close();
        self->Answer(local_rank, slot, checks);
      });
    });
  }

  // `checks`: none for an open, which checks nothing ("-" for each verdict).
  void Answer(int local_rank, const std::array<std::shared_ptr<SnapshotBuffer>, 2>& slot,
              const std::optional<std::array<BufferCheck, 2>>& checks) {
    std::string line = "ok";
    std::vector<int> fds;
    for (std::size_t i = 0; i < 2; ++i) {
      line += std::string(" ") + (checks ? Name((*checks)[i].verdict) : "-") + " " +
              std::to_string(slot[i] ? slot[i]->capacity() : 0);
      if (slot[i]) fds.push_back(slot[i]->fd());
      if (checks) NoteCorrupt((*checks)[i], local_rank);
    }
    if (checks) ++server_.counters_.loads;
    Reply(line, fds);
    Changed();
    Read();
  }

  void Reply(const std::string& line, const std::vector<int>& fds) {
    if (!SendWithFds(socket_.native_handle(), line + "\n", fds)) Close();
  }
  void Changed() {
    if (server_.on_change_) server_.on_change_();
  }
  void Close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  SnapshotServer& server_;  // valid while *alive_
  std::shared_ptr<bool> alive_;
  Local::socket socket_;
  asio::streambuf in_;
  pid_t pid_ = 0;
};

StatusOr<std::unique_ptr<SnapshotServer>> SnapshotServer::Listen(asio::io_context& io,
                                                                 NodeSnapshots& memory) {
  auto server = std::unique_ptr<SnapshotServer>(new SnapshotServer(io, memory));
  boost::system::error_code ec;
  std::string name = SnapshotSocketName(::getpid());
  name[0] = '\0';
  const Local::endpoint at(name);
  server->acceptor_.open(at.protocol(), ec);
  if (!ec) server->acceptor_.bind(at, ec);
  if (!ec) server->acceptor_.listen(64, ec);
  if (ec) return Unavailable("cannot listen on crun's snapshot socket: " + ec.message());
  server->Accept();
  return server;
}

SnapshotServer::SnapshotServer(asio::io_context& io, NodeSnapshots& memory)
    : io_(io), memory_(memory), acceptor_(io), alive_(std::make_shared<bool>(true)) {}

SerialWorker& SnapshotServer::SealerOf(int local_rank) {
  auto& w = sealers_[local_rank];
  if (!w) w = std::make_unique<SerialWorker>();
  return *w;
}

void SnapshotServer::QueueSeal(int local_rank, int index) {
  {
    std::lock_guard lock(pending_mu_);
    if (!pending_seals_.insert({local_rank, index}).second) return;  // one waits already
  }
  SealerOf(local_rank).Post([this, local_rank, index] {
    {
      std::lock_guard lock(pending_mu_);
      pending_seals_.erase({local_rank, index});
    }
    memory_.Seal(local_rank, index);
  });
}

SnapshotServer::~SnapshotServer() {
  *alive_ = false;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

void SnapshotServer::Accept() {
  acceptor_.async_accept(
      [this, alive = alive_](const boost::system::error_code& ec, Local::socket socket) {
        if (ec == asio::error::operation_aborted || !*alive) return;
        if (!ec) std::make_shared<Session>(*this, std::move(socket))->Start();
        Accept();
      });
}

}  // namespace crun::agent
