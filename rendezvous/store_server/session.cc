#include "rendezvous/store_server/session.h"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/spdlog.h>

#include "base/endpoint.h"

namespace crun::server_detail {
namespace {

namespace asio = boost::asio;
using wire::Command;

// A client that stops reading may have this much queued before we stop reading from it.
constexpr std::size_t kOutputHighWater = 4 * 1024 * 1024;
// Reads per readiness event before yielding to other connections.
constexpr int kReadsPerWake = 4;

}  // namespace

Session::Session(asio::ip::tcp::socket socket, std::shared_ptr<ServerShared> shared)
    : socket_(std::move(socket)), shared_(std::move(shared)), parser_(shared_->limits) {
  shared_->open.fetch_add(1, std::memory_order_relaxed);
}

Session::~Session() { shared_->open.fetch_sub(1, std::memory_order_relaxed); }

void Session::Start() {
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
  ArmRead();
}

std::string Session::Peer() const {
  boost::system::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (ec) return "unknown peer";
  return FormatEndpoint(ep.address().to_string(), ep.port());
}

void Session::ArmRead() {
  // A read (not a readiness wait): Asio re-registers interest with epoll_ctl for every wait,
  // but not for reads, so this costs no system call until data arrives.
  socket_.async_read_some(asio::buffer(inline_buffer_),
                          [self = shared_from_this()](const boost::system::error_code& ec,
                                                      std::size_t n) { self->OnRead(ec, n); });
}

void Session::OnRead(const boost::system::error_code& ec, std::size_t n) {
  if (closed_) return;
  if (ec) {
    // EOF or reset: the client went away. Its pending waits go with it.
    if (ec != asio::error::eof && ec != asio::error::connection_reset &&
        ec != asio::error::operation_aborted) {
      spdlog::debug("{}: read from {} failed: {}", shared_->name, Peer(), ec.message());
    }
    if (ec != asio::error::operation_aborted) Close();
    return;
  }
  if (!Consume(inline_buffer_.data(), n)) return;
  // A full small buffer means more may be waiting: take it in large reads.
  ReadMore(/*drained=*/n < inline_buffer_.size());
}

bool Session::Consume(const char* data, std::size_t n) {
  const auto result = parser_.Consume(std::string_view(data, n), [this](wire::Request& request) {
    shared_->requests.fetch_add(1, std::memory_order_relaxed);
    shared_->by_command[static_cast<std::size_t>(request.command)]
        .fetch_add(1, std::memory_order_relaxed);
    return Handle(request);
  });
  if (result == wire::RequestParser::Result::kError) {
    Fail(parser_.error());
    return false;
  }
  return result != wire::RequestParser::Result::kStopped;  // kStopped: Handle closed it
}

void Session::ReadMore(bool drained) {
  for (int i = 0; i < kReadsPerWake && !closed_ && !drained; ++i) {
    boost::system::error_code rec;
    const std::size_t n = socket_.read_some(asio::buffer(shared_->read_buffer), rec);
    if (rec == asio::error::would_block || rec == asio::error::try_again) {
      drained = true;  // empty: wait for readiness (going on would spin until data came)
      break;
    }
    if (rec) {
      OnRead(rec, 0);
      return;
    }
    if (!Consume(shared_->read_buffer.data(), n)) return;
    drained = n < shared_->read_buffer.size();  // a short read emptied the socket
  }
  Flush();
  if (closed_) return;
  if (pending_output() > kOutputHighWater) {
    // Resumed by OnWritten once the client reads its replies.
    read_paused_ = true;
    shared_->read_pauses.fetch_add(1, std::memory_order_relaxed);
  } else if (drained) {
    ArmRead();
  } else {
    ContinueReading();  // the read budget ran out: let other connections in, then go on
  }
}

// Goes on reading after other handlers had their turn (a spent read budget, or the end of a
// backpressure pause), without first waiting for readiness.
void Session::ContinueReading() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    if (!self->closed_) self->ReadMore(/*drained=*/false);
  });
}

bool Session::Handle(wire::Request& r) {
  KvState& state = shared_->state;
  auto& a = r.args;
  Status status;
  switch (r.command) {
    case Command::kValidate:
      break;
    case Command::kPing:
      wire::AppendU32(&out_, r.nonce);
      break;
    case Command::kSet:
      status = state.Set(std::move(a[0]), std::move(a[1]));
      break;
    case Command::kCompareSet: {
      auto v = state.CompareSet(std::move(a[0]), std::move(a[1]), std::move(a[2]));
      if (!v.ok()) {
        status = v.status();
      } else {
        wire::AppendBytes(&out_, *v);
      }
      break;
    }
    case Command::kGet: {
      // A missing key reads as empty (libuv behaviour) rather than dropping the connection.
      const std::string* v = state.Get(a[0]);
      wire::AppendBytes(&out_, v != nullptr ? std::string_view(*v) : std::string_view());
      break;
    }
    case Command::kAdd: {
      auto v = state.Add(std::move(a[0]), r.number);
      if (!v.ok()) {
        status = v.status();
      } else {
        wire::AppendI64(&out_, *v);
      }
      break;
    }
    case Command::kCheck:
      wire::AppendU8(&out_, state.Check(a) ? wire::kCheckReady : wire::kCheckNotReady);
      break;
    case Command::kWait:
      status = CanHoldAnother();
      if (status.ok() && state.Wait(a, this)) wire::AppendU8(&out_, wire::kStopWaiting);
      break;
    case Command::kGetNumKeys:
      wire::AppendI64(&out_, state.NumKeys());
      break;
    case Command::kWatchKey:
      status = CanHoldAnother();
      if (!status.ok()) break;
      state.Watch(a[0], this);
      wire::AppendU8(&out_, static_cast<std::uint8_t>(wire::WatchEvent::kRegistered));
      break;
    case Command::kDeleteKey:
      wire::AppendI64(&out_, state.DeleteKey(a[0]) ? 1 : 0);
      break;
    case Command::kAppend:
      status = state.Append(std::move(a[0]), a[1]);
      break;
    case Command::kMultiGet:
      for (const auto& key : a) {
        const std::string* v = state.Get(key);
        wire::AppendBytes(&out_, v != nullptr ? std::string_view(*v) : std::string_view());
      }
      break;
    case Command::kMultiSet:
      for (std::size_t i = 0; i + 1 < a.size() && status.ok(); i += 2) {
        status = state.Set(std::move(a[i]), std::move(a[i + 1]));
      }
      break;
    case Command::kCancelWait:
      state.CancelWaits(this);
      wire::AppendU8(&out_, wire::kWaitCanceled);  // answered even when nothing was pending
      break;
    case Command::kQueuePush:
      status = state.QueuePush(std::move(a[0]), std::move(a[1]));
      break;
    case Command::kQueuePop: {
      std::int64_t length = 0;
      auto v = state.QueuePop(a[0], &length);
      wire::AppendI64(&out_, length);
      if (v) wire::AppendBytes(&out_, *v);
      break;
    }
    case Command::kQueueLen:
      wire::AppendI64(&out_, state.QueueLen(a[0]));
      break;
    case Command::kListKeys: {
      auto keys = state.ListKeys();
      wire::AppendI64(&out_, static_cast<std::int64_t>(keys.size()));
      for (const auto& k : keys) wire::AppendBytes(&out_, k);
      break;
    }
    case Command::kBarrier: {
      status = CanHoldAnother();
      if (!status.ok()) break;
      auto released = state.Barrier(std::move(a[0]), r.number, this);
      if (!released.ok()) {
        status = released.status();
      } else if (*released) {
        wire::AppendU8(&out_, wire::kStopWaiting);
      }
      break;
    }
  }
  if (!status.ok()) {
    Fail(std::string(wire::CommandName(r.command)) + " refused: " + status.message());
    return false;
  }
  return true;
}

void Session::OnWaitDone() {
  wire::AppendU8(&out_, wire::kStopWaiting);
  ScheduleFlush();
}

void Session::OnWatchEvent(wire::WatchEvent event, std::string_view key, std::string_view old_value,
                           std::string_view new_value) {
  wire::AppendU8(&out_, static_cast<std::uint8_t>(event));
  wire::AppendBytes(&out_, key);
  wire::AppendBytes(&out_, old_value);
  wire::AppendBytes(&out_, new_value);
  ScheduleFlush();
}

// Called from inside another connection's request: defer the socket work, never re-enter
// the state from here.
void Session::ScheduleFlush() {
  if (flush_scheduled_ || closed_) return;
  flush_scheduled_ = true;
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    self->flush_scheduled_ = false;
    self->Flush();
  });
}

void Session::Flush() {
  if (closed_ || writing_ || out_.empty()) return;
  boost::system::error_code ec;
  const std::size_t n = socket_.write_some(asio::buffer(out_), ec);
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
    Close();
    return;
  }
  out_.erase(0, n);
  if (out_.empty()) return;
  writing_ = true;
  sending_.swap(out_);
  asio::async_write(socket_, asio::buffer(sending_),
                    [self = shared_from_this()](const boost::system::error_code& wec, std::size_t) {
                      self->OnWritten(wec);
                    });
}

void Session::OnWritten(const boost::system::error_code& ec) {
  writing_ = false;
  sending_.clear();
  if (closed_) return;
  if (ec) {
    Close();
    return;
  }
  Flush();
  if (read_paused_ && !closed_ && pending_output() <= kOutputHighWater) {
    read_paused_ = false;
    ContinueReading();
  }
}

Status Session::CanHoldAnother() const {
  const StoreLimits& l = shared_->limits;
  const std::size_t mine = shared_->state.held_by(this);
  if (mine >= l.max_waits_per_connection) {
    return ResourceExhausted("this connection already holds " + std::to_string(mine) +
                             " waits and watches, the limit per connection");
  }
  const std::size_t all = shared_->state.pending_waits();
  if (all >= l.max_pending_waits) {
    return ResourceExhausted("the store already holds " + std::to_string(all) +
                             " pending waits, its limit");
  }
  return Status::Ok();
}

void Session::Fail(const std::string& why) {
  shared_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
  spdlog::warn("{}: closing connection from {} ({} client): {}", shared_->name, Peer(),
               wire::DialectName(parser_.dialect()), why);
  Close();
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  shared_->state.Forget(this);
  boost::system::error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  if (shared_->on_close) shared_->on_close(this);
}

}  // namespace crun::server_detail
