// One client connection of a StoreServer (internal to crun_store_server).
//
// Threading: a session runs on its server's single-threaded event loop.
//
// Reads: a pending read targets a small buffer inside the session (typical c10d requests fit
// in it); when it fills, the rest is taken in large reads into the server-wide buffer. Replies
// are written directly when the socket accepts them and queued otherwise (one write in
// flight); a client that does not read its replies stops being read from until they drain.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/ip/tcp.hpp>

#include "rendezvous/store/kv_state.h"
#include "rendezvous/store/wire.h"

namespace crun::server_detail {

class Session;

// What the sessions of one server share. Lives on the server's event loop, held by the server and
// by each session: a session's last handlers (a read aborted by the server's stop) run after
// the server itself is gone, and must still find it.
struct ServerShared {
  explicit ServerShared(const StoreLimits& l) : limits(l), state(l.max_store_bytes) {}
  StoreLimits limits;
  KvState state;
  std::vector<char> read_buffer = std::vector<char>(64 * 1024);
  std::string name;  // "store 127.0.0.1:29500", for logs
  std::atomic<std::uint64_t> open{0};
  std::atomic<std::uint64_t> protocol_errors{0};
  std::atomic<std::uint64_t> requests{0};
  std::array<std::atomic<std::uint64_t>, wire::kCommandCount> by_command{};
  std::atomic<std::uint64_t> read_pauses{0};
  // Called once per session when it closes.
  std::function<void(Session*)> on_close;
};

class Session final : public std::enable_shared_from_this<Session>, public StoreListener {
 public:
  Session(boost::asio::ip::tcp::socket socket, std::shared_ptr<ServerShared> shared);
  ~Session();
  void Start();
  void Close();

  void OnWaitDone() override;
  void OnWatchEvent(wire::WatchEvent event, std::string_view key, std::string_view old_value,
                    std::string_view new_value) override;

 private:
  void ArmRead();
  void OnRead(const boost::system::error_code& ec, std::size_t n);
  // Reads on in large pieces until the socket is empty (or the budget is spent).
  void ReadMore(bool drained);
  void ContinueReading();
  // Parses and handles; false when the connection closed.
  bool Consume(const char* data, std::size_t n);
  // Handles one request; false when the connection must close (already logged).
  bool Handle(wire::Request& request);
  void Flush();
  void ScheduleFlush();
  void OnWritten(const boost::system::error_code& ec);
  void Fail(const std::string& why);
  // Whether this connection may hold one more wait or watch (StoreLimits).
  Status CanHoldAnother() const;
  std::string Peer() const;
  std::size_t pending_output() const { return out_.size() + sending_.size(); }

  boost::asio::ip::tcp::socket socket_;
  std::shared_ptr<ServerShared> shared_;
  wire::RequestParser parser_;
  std::array<char, 256> inline_buffer_;
  std::string out_;      // replies not yet handed to the socket
  std::string sending_;  // bytes of the write in flight
  bool writing_ = false;
  bool flush_scheduled_ = false;
  bool read_paused_ = false;
  bool closed_ = false;
};

}  // namespace crun::server_detail
