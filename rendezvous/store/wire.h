// The c10d TCPStore wire protocol, both generations (docs/store_protocol.md has the byte tables).
//
// * Commands are named by crun's own enum; the wire code of a command depends on the dialect:
//   PyTorch 1.13/2.0 clients ("legacy") and 2.1+ clients ("modern", every connection opens with
//   VALIDATE + magic) number them differently.
// * RequestParser turns a byte stream into Requests incrementally: bytes may arrive split at any
//   point, each field is taken whole or not at all, and a request never has to be re-parsed from
//   its start. Limits are checked on length prefixes before any payload is buffered.
// * EncodeRequest and the Append* helpers write the same format (client, tests, load generator).
//
// Nothing here does I/O or locking; a parser belongs to one connection.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/store/limits.h"

namespace crun::wire {

inline constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;

enum class Dialect : std::uint8_t {
  kUnknown,  // nothing decided yet (no byte seen on the connection)
  kLegacy,   // PyTorch 1.13 / 2.0 numbering, no VALIDATE
  kModern,   // PyTorch 2.1+ numbering, VALIDATE first
};
std::string_view DialectName(Dialect dialect);

enum class Command : std::uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,  // legacy only
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
};
std::string_view CommandName(Command command);
inline constexpr std::size_t kCommandCount = static_cast<std::size_t>(Command::kBarrier) + 1;

// Wire code of `command` in `dialect`, or -1 when that dialect has no such command.
int WireCode(Dialect dialect, Command command);

// Response bytes.
inline constexpr std::uint8_t kCheckReady = 0;
inline constexpr std::uint8_t kCheckNotReady = 1;
inline constexpr std::uint8_t kStopWaiting = 0;
inline constexpr std::uint8_t kWaitCanceled = 1;
enum class WatchEvent : std::uint8_t { kUpdated = 0, kCreated = 1, kDeleted = 2, kRegistered = 3 };

// One decoded request. `args` holds the keys and values in wire order:
//   SET/APPEND/QUEUE_PUSH: key, value      COMPARE_SET: key, expected, desired
//   GET/DELETE_KEY/QUEUE_POP/QUEUE_LEN/WATCH_KEY/ADD/BARRIER: key
//   CHECK/WAIT/MULTI_GET: keys...          MULTI_SET: key0, value0, key1, value1, ...
struct Request {
  Command command = Command::kPing;
  std::vector<std::string> args;
  std::int64_t number = 0;  // ADD delta, BARRIER world size
  std::uint32_t nonce = 0;  // VALIDATE magic, PING nonce
};

// Builds a request; fields not given stay zero.
Request MakeRequest(Command command, std::vector<std::string> args = {}, std::int64_t number = 0,
                    std::uint32_t nonce = 0);

// Appends the request in the dialect's encoding. Callers only pass commands the dialect has.
void EncodeRequest(Dialect dialect, const Request& request, std::string* out);

// Little-endian field writers (responses and requests).
void AppendU8(std::string* out, std::uint8_t v);
void AppendU32(std::string* out, std::uint32_t v);
void AppendU64(std::string* out, std::uint64_t v);
void AppendI64(std::string* out, std::int64_t v);
void AppendBytes(std::string* out, std::string_view bytes);  // u64 length + bytes

std::uint32_t LoadU32(const char* p);
std::uint64_t LoadU64(const char* p);

class RequestParser {
 public:
  enum class Result {
    kNeedMore,  // every complete request was handled; an unfinished tail (if any) is kept
    kStopped,   // on_request returned false
    kError,     // the stream is broken; error() says why, naming the offending value
  };

  explicit RequestParser(const StoreLimits& limits) : limits_(limits) {}

  // Parses the next bytes of the stream: every complete request (including one finished by
  // bytes kept from earlier chunks) is passed to `on_request(Request&)`, which returns false to
  // stop. `chunk` is read in place and only an unfinished tail is copied, so the caller may
  // reuse its memory as soon as Consume returns. After kError the parser stays broken.
  template <typename OnRequest>
  Result Consume(std::string_view chunk, OnRequest&& on_request) {
    Feed(chunk);
    for (;;) {
      const Step step = Next();
      if (step == Step::kNeedMore) return Result::kNeedMore;
      if (step == Step::kError) return Result::kError;
      if (!on_request(done_)) {
        KeepTail();
        return Result::kStopped;
      }
    }
  }

  Dialect dialect() const { return dialect_; }
  const std::string& error() const { return error_; }
  // Bytes held for a request that has not finished arriving.
  std::size_t buffered() const { return view_.size() - pos_; }

 private:
  enum class Step { kDone, kNeedMore, kError };
  void Feed(std::string_view chunk);
  // kDone: a request is ready in done_.
  Step Next();
  Step Sniff();
  Step ParseBody();
  Step ReadU32(std::uint32_t* v);
  Step ReadI64(std::int64_t* v);
  Step ReadString(bool is_key);
  Step ReadCount(std::uint64_t* count);
  Step Fail(std::string message);
  void KeepTail();
  std::size_t available() const { return view_.size() - pos_; }

  StoreLimits limits_;
  Dialect dialect_ = Dialect::kUnknown;
  std::string owned_;      // the unfinished tail, once one had to be kept
  std::string_view view_;  // the bytes being parsed: the caller's chunk or owned_
  std::size_t pos_ = 0;
  bool in_request_ = false;
  std::size_t step_ = 0;          // index of the next field of the current request
  std::uint64_t list_count_ = 0;  // length of the current key list / pair list
  bool list_counted_ = false;
  std::size_t request_bytes_ = 0;
  Request req_;   // the request being parsed
  Request done_;  // the last complete request, handed to on_request
  std::string error_;
};

}  // namespace crun::wire
