// TcpStoreClient: a Store over the TCPStore wire protocol, speaking the 2.x dialect (VALIDATE +
// PING first), against crun's server or a stock PyTorch 2.x server.
//
// * Connect() retries refused/reset/unresolvable connections with exponential backoff and
//   jitter until `connect_timeout`; the error names host:port and the last failure.
// * Waits time out client-side with the CANCEL_WAIT handshake, so the connection stays usable
//   after a timeout (if the keys arrive in the same instant, the wait succeeds).
// * An I/O or protocol failure breaks the connection for good: later calls fail at once with
//   the same error (a half-read reply would desynchronise the stream).
// * Thread-safe: calls are serialised on the one connection.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "base/socket.h"
#include "rendezvous/store/store.h"
#include "rendezvous/store/wire.h"

namespace crun {

struct TcpStoreClientOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  Millis connect_timeout = kDefaultStoreTimeout;
  Millis timeout = kDefaultStoreTimeout;  // for waits, and for replies to arrive
  Millis initial_backoff{10};
  Millis max_backoff{1000};
  // Called before each retry with the attempt that failed (1, 2, ...) and why, e.g. to log
  // "store 10.0.0.5:29500 not up yet (attempt 3): connection refused". Runs on the caller.
  std::function<void(int attempt, const Status& failure)> on_retry;

  Status Validate() const;
};

class TcpStoreClient final : public Store {
 public:
  static StatusOr<std::unique_ptr<TcpStoreClient>> Connect(const TcpStoreClientOptions& options);

  Status Set(std::string_view key, std::string_view value) override;
  StatusOr<std::string> Get(std::string_view key) override;
  StatusOr<std::string> CompareSet(std::string_view key, std::string_view expected,
                                   std::string_view desired) override;
  StatusOr<std::int64_t> Add(std::string_view key, std::int64_t delta) override;
  StatusOr<bool> Check(const std::vector<std::string>& keys) override;
  Status Wait(const std::vector<std::string>& keys, Millis timeout) override;
  using Store::Wait;
  StatusOr<std::int64_t> NumKeys() override;
  StatusOr<bool> DeleteKey(std::string_view key) override;
  Status Append(std::string_view key, std::string_view value) override;
  StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys) override;
  Status MultiSet(const std::vector<std::string>& keys,
                  const std::vector<std::string>& values) override;
  Status QueuePush(std::string_view key, std::string_view value) override;
  StatusOr<std::string> QueuePop(std::string_view key, bool block) override;
  StatusOr<std::int64_t> QueueLen(std::string_view key) override;
  StatusOr<std::vector<std::string>> ListKeys() override;
  Status Barrier(std::string_view key, std::int64_t world_size, Millis timeout) override;

  // PING with a fresh nonce; checks the echo.
  Status Ping();
  const std::string& endpoint() const { return endpoint_; }

 private:
  TcpStoreClient(UniqueFd fd, std::string endpoint, Millis timeout);
  Status Handshake();
  Status PingLocked();  // Ping, with mu_ held

  // Building blocks; all run with mu_ held.
  Status Send(const wire::Request& request);
  Status Read(char* dst, std::size_t n);
  StatusOr<std::uint8_t> ReadU8();
  StatusOr<std::int64_t> ReadI64();
  StatusOr<std::string> ReadBytes();
  // Sends WAIT (or BARRIER) already encoded by the caller and waits for STOP_WAITING until
  // `timeout`, cancelling with CANCEL_WAIT after it. `what` describes the wait for messages.
  Status AwaitStop(Millis timeout, const std::string& what);
  Status WaitLocked(const std::vector<std::string>& keys, Millis timeout);
  // Records the first failure; the connection is unusable afterwards.
  Status Break(Status status);
  Status CheckUsable() const;

  std::mutex mu_;
  UniqueFd fd_;
  std::string endpoint_;
  std::string peer_;  // "store <endpoint>", as errors name it
  Status broken_;
  std::string out_;
  std::string in_;  // bytes received but not consumed yet
  std::size_t in_pos_ = 0;
  SteadyClock::time_point read_deadline_;
  std::uint32_t next_nonce_;
};

// TcpStoreClient::Connect in tries of at most `slice` each, within options.connect_timeout,
// asking `keep_trying` between them: a caller that is stopping (a round that ended, an agent on
// its way out) gets kAborted within about a slice, even while the store is not up yet. Give
// options.timeout a slice too where a store that takes the connection and never answers must
// not hold the caller longer (the handshake waits that long).
StatusOr<std::unique_ptr<TcpStoreClient>> ConnectWhile(TcpStoreClientOptions options, Millis slice,
                                                       const std::function<bool()>& keep_trying);

}  // namespace crun
