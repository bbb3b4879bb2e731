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
namespace snap = crun::snapshot;
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
  std::int64_t rank = -1, world_size = 0;  // disk, restore
  std::uint64_t step = 0;                  // restore
};

// "verb L [more]": how many numbers each verb takes after the local rank.
StatusOr<Request> ParseRequest(const std::string& line) {
  std::istringstream in(line);
  Request r;
  std::vector<std::string> words;
  in >> r.verb;
  for (std::string w; in >> w;) words.push_back(w);
  const auto bad = [&] { return InvalidArgument("malformed snapshot request '" + line + "'"); };
  const std::size_t want =
      r.verb == "load" || r.verb == "open"                                                  ? 1
      : r.verb == "saved" || r.verb == "verify" || r.verb == "settle" || r.verb == "commit" ? 2
      : r.verb == "reserve" || r.verb == "disk" || r.verb == "restore"                      ? 3
                                                                                            : 0;
  if (want == 0 || words.size() != want) return bad();
  const auto l = ParseInteger(words[0], 0, kMaxLocalRank);
  if (!l) return bad();
  r.local_rank = static_cast<int>(*l);
  if (r.verb == "disk" || r.verb == "restore") {
    const auto rank = ParseInteger(words[1], 0, INT32_MAX);
    const auto third = ParseInteger(words[2], 0, INT64_MAX);
    if (!rank || !third) return bad();
    r.rank = *rank;
    if (r.verb == "disk") r.world_size = *third;
    r.step = static_cast<std::uint64_t>(*third);
    return r;
  }
  if (want == 1) return r;
  const auto i = ParseInteger(words[1], 0, 1);
  if (!i) return bad();
  r.index = static_cast<int>(*i);
  if (want == 2) return r;
  const auto b = ParseInteger(words[2], 0, INT64_MAX);
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
    if (r.verb == "commit") {
      ++server_.counters_.saves;
      auto self = shared_from_this();
      server_.QueueSeal(r.local_rank, r.index, [self] {
        if (!*self->alive_) return self->Close();
        self->Reply("ok", {});
        self->Changed();
        self->Read();
      });
      return;
    }
    if (r.verb == "verify") return Verify(r.local_rank, r.index);
    if (r.verb == "settle") return Settle(r.local_rank);
    if (r.verb == "disk") return DiskSteps(r);
    if (r.verb == "restore") return Restore(r);
    if (r.verb == "open") return Answer(r.local_rank, server_.memory_.Slot(r.local_rank), {});
    Load(r.local_rank);
  }

  // Runs `work` on the rank's sealer thread, after whatever was queued there before, and
  // `then` with its result back on the loop, unless the connection ended meanwhile. Every
  // request that touches a rank's buffers, a peer or the disk goes this way, so that it never
  // blocks the loop and is ordered with the rank's seals.
  template <class Work, class Then>
  void OnSealer(int local_rank, Work work, Then then) {
    auto self = shared_from_this();
    asio::io_context& io = server_.io_;
    server_.SealerOf(local_rank).Post([self, &io, work, then] {
      auto result = work();
      asio::post(io, [self, result, then] {
        if (!*self->alive_) return self->Close();
        then(result);
      });
    });
  }

  // Checked on the rank's sealer thread, answered back on the loop.
  void Verify(int local_rank, int index) {
    NodeSnapshots& memory = server_.memory_;
    OnSealer(
        local_rank, [&memory, local_rank, index] { return memory.Verify(local_rank, index); },
        [self = shared_from_this(), local_rank](const BufferCheck& check) {
          self->NoteCorrupt(check, local_rank);
          self->Reply(std::string("ok ") + Name(check.verdict), {});
          self->Changed();
          self->Read();
        });
  }

  // "ok" once the rank's sealer has done what was queued before: a worker about to overwrite a
  // buffer that crun has not sealed (or copied for disk) yet waits for it, so that no step
  // chosen for disk is lost to a fast worker (crun/worker/snapshot_layout.h).
  void Settle(int local_rank) {
    OnSealer(
        local_rank, [] { return true; },
        [self = shared_from_this()](bool) {
          self->Reply("ok", {});
          self->Read();
        });
  }

  // The steps this rank may load besides its memory, newest first ("ok" alone: none): those
  // on disk (--checkpoint-dir), and, when this node holds nothing of the rank (it took a lost
  // node's ranks over), the copies that other nodes of the round hold.
  void DiskSteps(const Request& r) {
    SnapshotServer& server = server_;
    OnSealer(
        r.local_rank,
        [&server, r] {
          std::set<std::uint64_t, std::greater<>> steps;
          if (server.disk_ != nullptr) {
            for (std::uint64_t step : server.disk_->Steps(r.rank, r.world_size)) {
              steps.insert(step);
            }
          }
          if (server.replicas_ != nullptr && server.replicas_->active() &&
              !server.memory_.HoldsRank(r.local_rank, r.rank)) {
            for (std::uint64_t step : server.replicas_->PeerSteps(r.rank, r.world_size)) {
              steps.insert(step);
            }
          }
          std::string line = "ok";
          char sep = ' ';
          for (std::uint64_t step : steps) {
            line += sep + std::to_string(step);
            sep = ',';
          }
          return line;
        },
        [self = shared_from_this()](const std::string& line) {
          self->Reply(line, {});
          self->Read();
        });
  }

  struct RestoredCopy {
    StatusOr<int> index;
    std::shared_ptr<SnapshotBuffer> buffer;
    std::string source;
  };

  // A step from a peer's copy or from disk into the rank's memory: "ok INDEX CAPACITY" and the
  // buffer. A peer's copy comes first: it is newer than disk, or as new and in memory.
  void Restore(const Request& r) {
    SnapshotServer& server = server_;
    OnSealer(
        r.local_rank,
        [&server, r] {
          RestoredCopy got{NotFound("no copy of rank " + std::to_string(r.rank) + " at step " +
                                    std::to_string(r.step) + " on another node or on disk"),
                           nullptr, ""};
          if (server.replicas_ != nullptr) {
            std::string from;
            auto index =
                server.replicas_->Fetch(r.rank, r.step, server.memory_, r.local_rank, &from);
            if (index.ok()) {
              got.index = index;
              got.source = "the copy on " + from;
            } else if (index.status().code() != StatusCode::kNotFound) {
              spdlog::warn("crun: cannot load rank {}'s copy at step {} from {}: {}", r.rank,
                           r.step, from, index.status().message());
            }
          }
          if (got.source.empty() && server.disk_ != nullptr) {
            got.index = server.disk_->Restore(server.memory_, r.local_rank, r.rank, r.step);
            got.source = server.disk_->options().dir;
          }
          if (got.index.ok()) {
            got.buffer = server.memory_.Slot(r.local_rank)[static_cast<std::size_t>(*got.index)];
          }
          return got;
        },
        [self = shared_from_this(), r](const RestoredCopy& got) {
          self->Restored(r, got.index, got.buffer, got.source);
        });
  }

  void Restored(const Request& r, const StatusOr<int>& index,
                const std::shared_ptr<SnapshotBuffer>& buffer, const std::string& source) {
    if (!index.ok() || !buffer) {
      spdlog::error("crun: cannot resume rank {} at step {}: {}", r.rank, r.step,
                    index.status().message());
      Reply("error " + index.status().message(), {});
    } else {
      if (!server_.told_resume_) {
        server_.told_resume_ = true;
        const bool disk = server_.disk_ != nullptr && source == server_.disk_->options().dir;
        spdlog::warn(
            "resuming from {}: step {} from {} (no newer snapshot that every rank holds is in "
            "this node's memory{})",
            disk ? "disk" : "a peer", r.step, source,
            disk ? "; --resume-from-disk off turns this off" : "");
      }
      Reply("ok " + std::to_string(*index) + " " + std::to_string(buffer->capacity()),
            {buffer->fd()});
    }
    Changed();
    Read();
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
    NodeSnapshots& memory = server_.memory_;
    using Found = std::pair<std::array<std::shared_ptr<SnapshotBuffer>, 2>,
                            std::optional<std::array<BufferCheck, 2>>>;
    OnSealer(
        local_rank,
        [&memory, local_rank] {
          // The slot is held while the answer is on its way.
          return Found{memory.Slot(local_rank), memory.Check(local_rank)};
        },
        [self = shared_from_this(), local_rank](const Found& found) {
          self->Answer(local_rank, found.first, found.second);
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

  // On the loop: valid while *alive_. In work on a sealer thread: always, since the server's
  // sealers are its last members, so its destructor joins them before anything they touch goes.
  SnapshotServer& server_;
  std::shared_ptr<bool> alive_;
  Local::socket socket_;
  asio::streambuf in_;
  pid_t pid_ = 0;
};

StatusOr<std::unique_ptr<SnapshotServer>> SnapshotServer::Listen(asio::io_context& io,
                                                                 NodeSnapshots& memory,
                                                                 DiskSnapshots* disk,
                                                                 Replicas* replicas) {
  auto server = std::unique_ptr<SnapshotServer>(new SnapshotServer(io, memory, disk, replicas));
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

SnapshotServer::SnapshotServer(asio::io_context& io, NodeSnapshots& memory, DiskSnapshots* disk,
                               Replicas* replicas)
    : io_(io),
      memory_(memory),
      disk_(disk),
      replicas_(replicas),
      acceptor_(io),
      alive_(std::make_shared<bool>(true)),
      writer_(disk != nullptr ? std::make_unique<SerialWorker>() : nullptr) {}

SerialWorker& SnapshotServer::SealerOf(int local_rank) {
  auto& w = sealers_[local_rank];
  if (!w) w = std::make_unique<SerialWorker>();
  return *w;
}

void SnapshotServer::QueueSeal(int local_rank, int index, std::function<void()> done) {
  const auto answer = [this, done] {
    if (done) asio::post(io_, done);
  };
  {
    std::lock_guard lock(pending_mu_);
    if (!pending_seals_.insert({local_rank, index}).second) {  // one waits already: after it
      SealerOf(local_rank).Post(answer);
      return;
    }
  }
  SealerOf(local_rank).Post([this, local_rank, index, answer] {
    {
      std::lock_guard lock(pending_mu_);
      pending_seals_.erase({local_rank, index});
    }
    const auto step = disk_ != nullptr ? memory_.CompleteStep(local_rank, index) : std::nullopt;
    if (step && disk_->Choose(local_rank, *step)) {
      Persist(local_rank, index);
    } else {
      memory_.Seal(local_rank, index);
    }
    if (replicas_ != nullptr && replicas_->active()) Replicate(local_rank, index);
    answer();
  });
}

// On the rank's sealer thread: the sealed buffer, as it is, to the next node. The worker does
// not write it meanwhile: a save that commits waits for this, and a save into this buffer
// waits for its seal (settle).
void SnapshotServer::Replicate(int local_rank, int index) {
  const auto b = memory_.Slot(local_rank)[static_cast<std::size_t>(index)];
  if (!b || !snap::DoneWith(b->header()) || snap::LoadState(b->header()) != snap::kComplete) {
    return;
  }
  const snap::BufferHeader& h = b->header();
  const Status s = replicas_->Send(local_rank, reinterpret_cast<const unsigned char*>(&h),
                                   b->payload(), h.payload_bytes);
  if (!s.ok() && !told_replica_.exchange(true)) {
    spdlog::warn(
        "crun: local rank {}'s snapshot at step {} was not copied to the next node: {} "
        "(said once; crun_agent_snapshot_replica_failures_total counts them)",
        local_rank, h.step, s.message());
  }
}

// On the rank's sealer thread: seals buffer `index` from a copy that the writer then puts on
// disk. A chosen step is not dropped because the writer is busy (another rank of the job may
// write it, and the job resumes only from a step every rank has): up to kQueuedCopies copies
// of a rank wait for the writer, and beyond that this thread waits too. Only a copy that the
// worker's next save overtook is not written.
void SnapshotServer::Persist(int local_rank, int index) {
  {
    std::unique_lock lock(pending_mu_);
    const bool room = writes_cv_.wait_for(lock, kWriterWait, [&] {
      return outstanding_writes_[local_rank] < kQueuedCopies;
    });
    if (!room) {
      lock.unlock();
      return SkipDiskStep(local_rank, index, "the disk writer is still busy with older steps");
    }
    ++outstanding_writes_[local_rank];
  }
  auto staged = std::make_shared<std::vector<unsigned char>>();
  const BufferCheck check = memory_.Stage(local_rank, index, staged.get());
  if (check.verdict != BufferVerdict::kValid) {
    Written(local_rank);
    return SkipDiskStep(local_rank, -1, "the worker's next save began before crun copied it");
  }
  writer_->Post([this, local_rank, staged] {
    if (Status s = disk_->Write(*staged); !s.ok()) {
      disk_->CountFailed();
      spdlog::error("crun: cannot write local rank {}'s snapshot to disk: {}", local_rank,
                    s.message());
    }
    Written(local_rank);
    asio::post(io_, [this, alive = alive_] {  // the metrics and the heartbeats hear of it
      if (*alive && on_change_) on_change_();
    });
  });
}

void SnapshotServer::Written(int local_rank) {
  {
    std::lock_guard lock(pending_mu_);
    --outstanding_writes_[local_rank];
  }
  writes_cv_.notify_all();
}

// A step chosen for disk that is not written: said once, counted always. `index` >= 0: the
// buffer still needs its seal.
void SnapshotServer::SkipDiskStep(int local_rank, int index, const char* why) {
  disk_->CountSkipped();
  if (!told_skip_.exchange(true)) {
    spdlog::warn(
        "a snapshot of local rank {} chosen for {} was not written: {} (disk writes are "
        "falling behind the saves: a larger --checkpoint-every writes less often; "
        "crun_agent_snapshot_disk_skipped_total counts these)",
        local_rank, disk_->options().dir, why);
  }
  if (index >= 0) memory_.Seal(local_rank, index);
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
