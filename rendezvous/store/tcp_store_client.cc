#include "rendezvous/store/tcp_store_client.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "base/backoff.h"

namespace crun {
namespace {

using wire::Command;
using wire::MakeRequest;
using wire::Request;

}  // namespace

Status TcpStoreClientOptions::Validate() const {
  if (host.empty()) return InvalidArgument("store host is empty");
  if (port == 0) return InvalidArgument("store port 0 is not a port a client can connect to");
  if (connect_timeout.count() < 0) {
    return InvalidArgument("connect timeout " + std::to_string(connect_timeout.count()) +
                           " ms is negative");
  }
  if (timeout.count() < 0) {
    return InvalidArgument("store timeout " + std::to_string(timeout.count()) + " ms is negative");
  }
  return Status::Ok();
}

TcpStoreClient::TcpStoreClient(UniqueFd fd, std::string endpoint, Millis timeout)
    : fd_(std::move(fd)),
      endpoint_(std::move(endpoint)),
      peer_("store " + endpoint_),
      next_nonce_(static_cast<std::uint32_t>(::getpid())) {
  timeout_ = timeout;
}

StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(
    const TcpStoreClientOptions& options) {
  CRUN_RETURN_IF_ERROR(options.Validate());
  const std::string endpoint = FormatEndpoint(options.host, options.port);
  const auto deadline = DeadlineAfter(options.connect_timeout);
  std::random_device seed;
  Backoff backoff(options.initial_backoff, options.max_backoff, 1.5, 0.5, seed());
  int attempts = 0;
  for (;;) {
    ++attempts;
    auto fd = ConnectTcp(options.host, options.port, deadline);
    Status failure;
    if (fd.ok()) {
      std::unique_ptr<TcpStoreClient> client(
          new TcpStoreClient(std::move(fd).value(), endpoint, options.timeout));
      failure = client->Handshake();
      if (failure.ok()) return client;
    } else {
      failure = fd.status();
    }
    // Refused, reset, not yet resolvable or a failed handshake: the store may still be coming
    // up. Anything else (a bad address family, say) will not get better.
    const bool retry =
        failure.code() == StatusCode::kUnavailable || failure.code() == StatusCode::kTimeout;
    const auto now = SteadyClock::now();
    if (!retry || now >= deadline) {
      return Status(retry ? StatusCode::kTimeout : failure.code(),
                    "could not connect to store " + endpoint + " within " +
                        std::to_string(options.connect_timeout.count()) + " ms (" +
                        std::to_string(attempts) + " attempts): " + failure.message());
    }
    if (options.on_retry) options.on_retry(attempts, failure);
    const auto pause = std::min<SteadyClock::duration>(backoff.Next(), deadline - now);
    std::this_thread::sleep_for(pause);  // retry pacing, not synchronisation
  }
}

StatusOr<std::unique_ptr<TcpStoreClient>> ConnectWhile(TcpStoreClientOptions options, Millis slice,
                                                       const std::function<bool()>& keep_trying) {
  const Millis total = options.connect_timeout;
  const auto deadline = DeadlineAfter(total);
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - SteadyClock::now());
    options.connect_timeout = std::clamp(left, Millis(1), slice);
    auto client = TcpStoreClient::Connect(options);
    if (client.ok() || client.status().code() != StatusCode::kTimeout) return client;
    if (SteadyClock::now() >= deadline) {
      return TimeoutError("the store at " + FormatEndpoint(options.host, options.port) +
                          " did not answer within " + std::to_string(total.count()) +
                          " ms: " + client.status().message());
    }
    if (!keep_trying()) return Aborted("stopped while connecting to the store");
  }
}

Status TcpStoreClient::Handshake() {
  std::lock_guard lock(mu_);
  Request validate = MakeRequest(Command::kValidate);
  validate.nonce = wire::kValidationMagic;
  CRUN_RETURN_IF_ERROR(Send(validate));
  return PingLocked();
}

Status TcpStoreClient::Break(Status status) {
  if (broken_.ok()) broken_ = status;
  fd_.reset();
  return status;
}

Status TcpStoreClient::CheckUsable() const {
  if (broken_.ok()) return Status::Ok();
  return Status(broken_.code(),
                "store " + endpoint_ +
                    ": connection unusable after an earlier failure: " + broken_.message());
}

Status TcpStoreClient::Send(const Request& request) {
  CRUN_RETURN_IF_ERROR(CheckUsable());
  out_.clear();
  wire::EncodeRequest(wire::Dialect::kModern, request, &out_);
  Status s = SendAll(fd_.get(), out_, DeadlineAfter(timeout_), peer_);
  if (!s.ok()) return Break(s);
  read_deadline_ = DeadlineAfter(timeout_);
  return Status::Ok();
}

Status TcpStoreClient::Read(char* dst, std::size_t n) {
  CRUN_RETURN_IF_ERROR(CheckUsable());
  std::size_t have = in_.size() - in_pos_;
  if (have < n) {
    if (in_pos_ > 0) {
      in_.erase(0, in_pos_);
      in_pos_ = 0;
    }
    const std::size_t want = n - have;
    const std::size_t room = std::max<std::size_t>(want, 64 * 1024);
    in_.resize(have + room);
    auto got = RecvSome(fd_.get(), in_.data() + have, want, room, read_deadline_, peer_);
    if (!got.ok()) {
      in_.resize(have);
      // A timeout while reading a reply leaves the stream mid-message: unusable.
      return Break(got.status());
    }
    in_.resize(have + *got);
  }
  std::memcpy(dst, in_.data() + in_pos_, n);
  in_pos_ += n;
  return Status::Ok();
}

StatusOr<std::uint8_t> TcpStoreClient::ReadU8() {
  char c;
  CRUN_RETURN_IF_ERROR(Read(&c, 1));
  return static_cast<std::uint8_t>(c);
}

StatusOr<std::int64_t> TcpStoreClient::ReadI64() {
  char b[8];
  CRUN_RETURN_IF_ERROR(Read(b, 8));
  return static_cast<std::int64_t>(wire::LoadU64(b));
}

StatusOr<std::string> TcpStoreClient::ReadBytes() {
  char b[8];
  CRUN_RETURN_IF_ERROR(Read(b, 8));
  const std::uint64_t len = wire::LoadU64(b);
  if (len > (1ULL << 40)) {
    return Break(ProtocolError("store " + endpoint_ + " sent a value length of " +
                               std::to_string(len) + " bytes"));
  }
  std::string value(len, '\0');
  CRUN_RETURN_IF_ERROR(Read(value.data(), len));
  return value;
}

Status TcpStoreClient::AwaitStop(Millis timeout, const std::string& what) {
  read_deadline_ = DeadlineAfter(timeout);
  CRUN_RETURN_IF_ERROR(CheckUsable());
  std::size_t have = in_.size() - in_pos_;
  Status got = Status::Ok();
  if (have == 0) {
    char c;
    auto n = RecvSome(fd_.get(), &c, 1, 1, read_deadline_, peer_);
    if (n.ok()) {
      in_.assign(1, c);
      in_pos_ = 0;
    } else {
      got = n.status();
    }
  }
  if (got.code() == StatusCode::kTimeout) {
    // c10d handshake: CANCEL_WAIT, then WAIT_CANCELED, preceded by STOP_WAITING if the keys
    // arrived meanwhile (then the wait succeeded after all).
    CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kCancelWait)));
    auto first = ReadU8();
    if (!first.ok()) return first.status();
    bool arrived = false;
    if (*first == wire::kStopWaiting) {
      arrived = true;
      first = ReadU8();
      if (!first.ok()) return first.status();
    }
    if (*first != wire::kWaitCanceled) {
      return Break(ProtocolError("store " + endpoint_ + " answered CANCEL_WAIT with byte " +
                                 std::to_string(*first)));
    }
    if (arrived) return Status::Ok();
    return TimeoutError("store " + endpoint_ + ": " + what + " timed out after " +
                        std::to_string(timeout.count()) + " ms");
  }
  if (!got.ok()) return Break(got);
  auto reply = ReadU8();
  if (!reply.ok()) return reply.status();
  if (*reply != wire::kStopWaiting) {
    return Break(ProtocolError("store " + endpoint_ + " answered " + what + " with byte " +
                               std::to_string(*reply)));
  }
  return Status::Ok();
}

Status TcpStoreClient::WaitLocked(const std::vector<std::string>& keys, Millis timeout) {
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kWait, keys)));
  return AwaitStop(timeout, "wait for keys " + DescribeKeys(keys));
}

Status TcpStoreClient::Set(std::string_view key, std::string_view value) {
  std::lock_guard lock(mu_);
  return Send(MakeRequest(Command::kSet, {std::string(key), std::string(value)}));
}

StatusOr<std::string> TcpStoreClient::Get(std::string_view key) {
  std::lock_guard lock(mu_);
  std::vector<std::string> keys{std::string(key)};
  CRUN_RETURN_IF_ERROR(WaitLocked(keys, timeout_));
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kGet, keys)));
  return ReadBytes();
}

StatusOr<std::string> TcpStoreClient::CompareSet(std::string_view key, std::string_view expected,
                                                 std::string_view desired) {
  std::lock_guard lock(mu_);
  CRUN_RETURN_IF_ERROR(
      Send(MakeRequest(Command::kCompareSet,
                       {std::string(key), std::string(expected), std::string(desired)})));
  return ReadBytes();
}

StatusOr<std::int64_t> TcpStoreClient::Add(std::string_view key, std::int64_t delta) {
  std::lock_guard lock(mu_);
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kAdd, {std::string(key)}, delta)));
  return ReadI64();
}

StatusOr<bool> TcpStoreClient::Check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kCheck, keys)));
  auto reply = ReadU8();
  if (!reply.ok()) return reply.status();
  return *reply == wire::kCheckReady;
}

Status TcpStoreClient::Wait(const std::vector<std::string>& keys, Millis timeout) {
  std::lock_guard lock(mu_);
  return WaitLocked(keys, timeout);
}

StatusOr<std::int64_t> TcpStoreClient::NumKeys() {
  std::lock_guard lock(mu_);
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kGetNumKeys)));
  return ReadI64();
}

StatusOr<bool> TcpStoreClient::DeleteKey(std::string_view key) {
  std::lock_guard lock(mu_);
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kDeleteKey, {std::string(key)})));
  auto n = ReadI64();
  if (!n.ok()) return n.status();
  return *n != 0;
}

Status TcpStoreClient::Append(std::string_view key, std::string_view value) {
  std::lock_guard lock(mu_);
  return Send(MakeRequest(Command::kAppend, {std::string(key), std::string(value)}));
}

StatusOr<std::vector<std::string>> TcpStoreClient::MultiGet(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  CRUN_RETURN_IF_ERROR(WaitLocked(keys, timeout_));
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kMultiGet, keys)));
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto v = ReadBytes();
    if (!v.ok()) return v.status();
    values.push_back(std::move(v).value());
  }
  return values;
}

Status TcpStoreClient::MultiSet(const std::vector<std::string>& keys,
                                const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return InvalidArgument("multi_set got " + std::to_string(keys.size()) + " keys but " +
                           std::to_string(values.size()) + " values");
  }
  std::vector<std::string> args;
  args.reserve(2 * keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    args.push_back(keys[i]);
    args.push_back(values[i]);
  }
  std::lock_guard lock(mu_);
  return Send(MakeRequest(Command::kMultiSet, std::move(args)));
}

Status TcpStoreClient::QueuePush(std::string_view key, std::string_view value) {
  std::lock_guard lock(mu_);
  return Send(MakeRequest(Command::kQueuePush, {std::string(key), std::string(value)}));
}

StatusOr<std::string> TcpStoreClient::QueuePop(std::string_view key, bool block) {
  std::lock_guard lock(mu_);
  std::vector<std::string> keys{std::string(key)};
  if (block) CRUN_RETURN_IF_ERROR(WaitLocked(keys, timeout_));
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kQueuePop, keys)));
  auto length = ReadI64();
  if (!length.ok()) return length.status();
  if (*length <= 0) return NotFound("store " + endpoint_ + ": queue '" + keys[0] + "' is empty");
  return ReadBytes();
}

StatusOr<std::int64_t> TcpStoreClient::QueueLen(std::string_view key) {
  std::lock_guard lock(mu_);
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kQueueLen, {std::string(key)})));
  return ReadI64();
}

StatusOr<std::vector<std::string>> TcpStoreClient::ListKeys() {
  std::lock_guard lock(mu_);
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kListKeys)));
  auto n = ReadI64();
  if (!n.ok()) return n.status();
  if (*n < 0) return Break(ProtocolError("store " + endpoint_ + " listed a negative key count"));
  std::vector<std::string> keys;
  for (std::int64_t i = 0; i < *n; ++i) {
    auto k = ReadBytes();
    if (!k.ok()) return k.status();
    keys.push_back(std::move(k).value());
  }
  return keys;
}

Status TcpStoreClient::Barrier(std::string_view key, std::int64_t world_size, Millis timeout) {
  std::lock_guard lock(mu_);
  CRUN_RETURN_IF_ERROR(Send(MakeRequest(Command::kBarrier, {std::string(key)}, world_size)));
  return AwaitStop(timeout, "barrier on key " + std::string(key) + " (world size " +
                                std::to_string(world_size) + ")");
}

Status TcpStoreClient::Ping() {
  std::lock_guard lock(mu_);
  return PingLocked();
}

Status TcpStoreClient::PingLocked() {
  Request ping = MakeRequest(Command::kPing);
  ping.nonce = next_nonce_++;
  CRUN_RETURN_IF_ERROR(Send(ping));
  char echo[4];
  CRUN_RETURN_IF_ERROR(Read(echo, 4));
  if (wire::LoadU32(echo) != ping.nonce) {
    return Break(ProtocolError("store " + endpoint_ + " echoed PING " + std::to_string(ping.nonce) +
                               " as " + std::to_string(wire::LoadU32(echo))));
  }
  return Status::Ok();
}

}  // namespace crun
