#include "rendezvous/store/wire.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <span>

namespace crun::wire {
namespace {

// What follows the command byte, field by field.
enum class Field : std::uint8_t { kKey, kValue, kI64, kU32, kKeyList, kPairList };

std::span<const Field> Layout(Command command) {
  static constexpr Field kU32Only[] = {Field::kU32};
  static constexpr Field kKeyValue[] = {Field::kKey, Field::kValue};
  static constexpr Field kKeyTwoValues[] = {Field::kKey, Field::kValue, Field::kValue};
  static constexpr Field kKeyOnly[] = {Field::kKey};
  static constexpr Field kKeyNumber[] = {Field::kKey, Field::kI64};
  static constexpr Field kKeys[] = {Field::kKeyList};
  static constexpr Field kPairs[] = {Field::kPairList};
  switch (command) {
    case Command::kValidate:
    case Command::kPing:
      return kU32Only;
    case Command::kSet:
    case Command::kAppend:
    case Command::kQueuePush:
      return kKeyValue;
    case Command::kCompareSet:
      return kKeyTwoValues;
    case Command::kGet:
    case Command::kDeleteKey:
    case Command::kQueuePop:
    case Command::kQueueLen:
    case Command::kWatchKey:
      return kKeyOnly;
    case Command::kAdd:
    case Command::kBarrier:
      return kKeyNumber;
    case Command::kCheck:
    case Command::kWait:
    case Command::kMultiGet:
      return kKeys;
    case Command::kMultiSet:
      return kPairs;
    case Command::kGetNumKeys:
    case Command::kCancelWait:
    case Command::kListKeys:
      return {};
  }
  return {};
}

constexpr std::array<Command, 9> kLegacyCodes = {
    Command::kSet,  Command::kCompareSet, Command::kGet,      Command::kAdd,       Command::kCheck,
    Command::kWait, Command::kGetNumKeys, Command::kWatchKey, Command::kDeleteKey,
};
constexpr std::array<Command, 19> kModernCodes = {
    Command::kValidate,   Command::kSet,      Command::kCompareSet, Command::kGet,
    Command::kAdd,        Command::kCheck,    Command::kWait,       Command::kGetNumKeys,
    Command::kDeleteKey,  Command::kAppend,   Command::kMultiGet,   Command::kMultiSet,
    Command::kCancelWait, Command::kPing,     Command::kQueuePush,  Command::kQueuePop,
    Command::kQueueLen,   Command::kListKeys, Command::kBarrier,
};

std::span<const Command> CodeTable(Dialect dialect) {
  if (dialect == Dialect::kLegacy) return kLegacyCodes;
  if (dialect == Dialect::kModern) return kModernCodes;
  return {};
}

std::string Hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

template <typename T>
void AppendRaw(std::string* out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // host order is little-endian on every target we build
  out->append(bytes, sizeof(T));
}

}  // namespace

std::string_view DialectName(Dialect dialect) {
  switch (dialect) {
    case Dialect::kUnknown:
      return "undetected";
    case Dialect::kLegacy:
      return "1.13";
    case Dialect::kModern:
      return "2.x";
  }
  return "?";
}

std::string_view CommandName(Command command) {
  switch (command) {
    case Command::kValidate:
      return "VALIDATE";
    case Command::kSet:
      return "SET";
    case Command::kCompareSet:
      return "COMPARE_SET";
    case Command::kGet:
      return "GET";
    case Command::kAdd:
      return "ADD";
    case Command::kCheck:
      return "CHECK";
    case Command::kWait:
      return "WAIT";
    case Command::kGetNumKeys:
      return "GETNUMKEYS";
    case Command::kWatchKey:
      return "WATCH_KEY";
    case Command::kDeleteKey:
      return "DELETE_KEY";
    case Command::kAppend:
      return "APPEND";
    case Command::kMultiGet:
      return "MULTI_GET";
    case Command::kMultiSet:
      return "MULTI_SET";
    case Command::kCancelWait:
      return "CANCEL_WAIT";
    case Command::kPing:
      return "PING";
    case Command::kQueuePush:
      return "QUEUE_PUSH";
    case Command::kQueuePop:
      return "QUEUE_POP";
    case Command::kQueueLen:
      return "QUEUE_LEN";
    case Command::kListKeys:
      return "LIST_KEYS";
    case Command::kBarrier:
      return "BARRIER";
  }
  return "?";
}

int WireCode(Dialect dialect, Command command) {
  auto table = CodeTable(dialect);
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (table[i] == command) return static_cast<int>(i);
  }
  return -1;
}

void AppendU8(std::string* out, std::uint8_t v) { out->push_back(static_cast<char>(v)); }
void AppendU32(std::string* out, std::uint32_t v) { AppendRaw(out, v); }
void AppendU64(std::string* out, std::uint64_t v) { AppendRaw(out, v); }
void AppendI64(std::string* out, std::int64_t v) { AppendRaw(out, v); }
void AppendBytes(std::string* out, std::string_view bytes) {
  AppendU64(out, bytes.size());
  out->append(bytes);
}

std::uint32_t LoadU32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
std::uint64_t LoadU64(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

Request MakeRequest(Command command, std::vector<std::string> args, std::int64_t number,
                    std::uint32_t nonce) {
  Request r;
  r.command = command;
  r.args = std::move(args);
  r.number = number;
  r.nonce = nonce;
  return r;
}

void EncodeRequest(Dialect dialect, const Request& request, std::string* out) {
  const int code = WireCode(dialect, request.command);
  assert(code >= 0 && "command does not exist in this dialect");
  AppendU8(out, static_cast<std::uint8_t>(code));
  std::size_t arg = 0;
  for (Field field : Layout(request.command)) {
    switch (field) {
      case Field::kKey:
      case Field::kValue:
        AppendBytes(out, request.args[arg++]);
        break;
      case Field::kI64:
        AppendI64(out, request.number);
        break;
      case Field::kU32:
        AppendU32(out, request.nonce);
        break;
      case Field::kKeyList:
        AppendU64(out, request.args.size());
        for (const auto& key : request.args) AppendBytes(out, key);
        break;
      case Field::kPairList:
        AppendI64(out, static_cast<std::int64_t>(request.args.size() / 2));
        for (const auto& part : request.args) AppendBytes(out, part);
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RequestParser

void RequestParser::Feed(std::string_view chunk) {
  if (!error_.empty() || chunk.empty()) return;
  if (available() == 0) {
    // Nothing pending: parse the caller's bytes where they lie.
    owned_.clear();
    if (owned_.capacity() > 64 * 1024) std::string().swap(owned_);  // give back a big buffer
    view_ = chunk;
    pos_ = 0;
    return;
  }
  if (view_.data() != owned_.data()) KeepTail();
  owned_.append(chunk);
  view_ = owned_;
}

void RequestParser::KeepTail() {
  if (view_.data() == owned_.data()) {
    // Drop consumed bytes now and then so the owned buffer does not grow without bound.
    if (pos_ > 0 && pos_ >= owned_.size() / 2) {
      owned_.erase(0, pos_);
      pos_ = 0;
      view_ = owned_;
    }
    return;
  }
  owned_.assign(view_.substr(pos_));
  pos_ = 0;
  view_ = owned_;
}

RequestParser::Step RequestParser::Fail(std::string message) {
  error_ = std::move(message);
  return Step::kError;
}

RequestParser::Step RequestParser::Next() {
  if (!error_.empty()) return Step::kError;
  Step step = Step::kDone;
  if (dialect_ == Dialect::kUnknown) step = Sniff();
  if (step == Step::kDone && !in_request_) {
    if (available() == 0) {
      step = Step::kNeedMore;
    } else {
      const auto code = static_cast<std::uint8_t>(view_[pos_]);
      auto table = CodeTable(dialect_);
      if (code >= table.size()) {
        step = Fail("unknown command byte " + Hex(code) + " from a " +
                    std::string(DialectName(dialect_)) + " client");
      } else {
        ++pos_;
        in_request_ = true;
        req_.command = table[code];
        req_.args.clear();
        req_.number = 0;
        req_.nonce = 0;
        step_ = 0;
        list_counted_ = false;
        request_bytes_ = 1;
      }
    }
  }
  if (step == Step::kDone) step = ParseBody();
  if (step == Step::kDone) {
    in_request_ = false;
    std::swap(done_, req_);  // req_ keeps done_'s old buffers for reuse
  } else if (step == Step::kNeedMore) {
    KeepTail();
  }
  return step;
}

RequestParser::Step RequestParser::Sniff() {
  if (available() == 0) return Step::kNeedMore;
  const auto first = static_cast<std::uint8_t>(view_[pos_]);
  if (first == 0) {
    // Either VALIDATE + magic (2.x) or a 1.13 SET, which is at least 17 bytes long, so waiting
    // for 5 bytes cannot stall a legitimate client.
    if (available() < 5) return Step::kNeedMore;
    dialect_ =
        LoadU32(view_.data() + pos_ + 1) == kValidationMagic ? Dialect::kModern : Dialect::kLegacy;
    return Step::kDone;
  }
  if (first == 0xCE) {
    // Possibly the magic itself: decide on all 4 bytes, however they are split.
    char magic[4];
    for (int i = 0; i < 4; ++i) magic[i] = static_cast<char>((kValidationMagic >> (8 * i)) & 0xFF);
    const std::size_t seen = std::min<std::size_t>(available(), 4);
    if (view_.substr(pos_, seen) == std::string_view(magic, seen)) {
      if (seen < 4) return Step::kNeedMore;
      return Fail(
          "client sends the magic before every request (an Aug 2023 nightly format); "
          "use a released PyTorch");
    }
  }
  if (first < kLegacyCodes.size()) {
    dialect_ = Dialect::kLegacy;
    return Step::kDone;
  }
  return Fail("first byte " + Hex(first) +
              " is neither a 2.x VALIDATE (00 ce f7 85 3c) nor a 1.13 command (0x00-0x08)");
}

RequestParser::Step RequestParser::ReadU32(std::uint32_t* v) {
  if (available() < 4) return Step::kNeedMore;
  *v = LoadU32(view_.data() + pos_);
  pos_ += 4;
  request_bytes_ += 4;
  return Step::kDone;
}

RequestParser::Step RequestParser::ReadI64(std::int64_t* v) {
  if (available() < 8) return Step::kNeedMore;
  *v = static_cast<std::int64_t>(LoadU64(view_.data() + pos_));
  pos_ += 8;
  request_bytes_ += 8;
  return Step::kDone;
}

RequestParser::Step RequestParser::ReadCount(std::uint64_t* count) {
  if (available() < 8) return Step::kNeedMore;
  const std::uint64_t n = LoadU64(view_.data() + pos_);
  if (n > limits_.max_keys_per_request) {
    return Fail(std::string(CommandName(req_.command)) + " names " +
                std::to_string(static_cast<std::int64_t>(n)) + " keys; the limit is " +
                std::to_string(limits_.max_keys_per_request));
  }
  pos_ += 8;
  request_bytes_ += 8;
  *count = n;
  return Step::kDone;
}

RequestParser::Step RequestParser::ReadString(bool is_key) {
  if (available() < 8) return Step::kNeedMore;
  const std::uint64_t len = LoadU64(view_.data() + pos_);
  const std::size_t limit = is_key ? limits_.max_key_bytes : limits_.max_value_bytes;
  if (len > limit) {
    return Fail(std::string(CommandName(req_.command)) + (is_key ? " key" : " value") + " length " +
                std::to_string(len) + " exceeds the limit of " + std::to_string(limit) + " bytes");
  }
  if (request_bytes_ + 8 + len > limits_.max_request_bytes) {
    return Fail(std::string(CommandName(req_.command)) + " request exceeds " +
                std::to_string(limits_.max_request_bytes) + " bytes");
  }
  if (available() < 8 + len) return Step::kNeedMore;
  req_.args.emplace_back(view_.data() + pos_ + 8, len);
  pos_ += 8 + len;
  request_bytes_ += 8 + len;
  return Step::kDone;
}

RequestParser::Step RequestParser::ParseBody() {
  const auto layout = Layout(req_.command);
  while (step_ < layout.size()) {
    Step s = Step::kDone;
    switch (layout[step_]) {
      case Field::kKey:
        s = ReadString(/*is_key=*/true);
        break;
      case Field::kValue:
        s = ReadString(/*is_key=*/false);
        break;
      case Field::kI64:
        s = ReadI64(&req_.number);
        break;
      case Field::kU32:
        s = ReadU32(&req_.nonce);
        break;
      case Field::kKeyList:
      case Field::kPairList: {
        const bool pairs = layout[step_] == Field::kPairList;
        if (!list_counted_) {
          s = ReadCount(&list_count_);
          if (s != Step::kDone) return s;
          list_counted_ = true;
          req_.args.reserve(pairs ? 2 * list_count_ : list_count_);
        }
        const std::size_t want = pairs ? 2 * list_count_ : list_count_;
        while (s == Step::kDone && req_.args.size() < want) {
          // In a pair list even positions are keys, odd ones values.
          s = ReadString(/*is_key=*/!pairs || req_.args.size() % 2 == 0);
        }
        break;
      }
    }
    if (s != Step::kDone) return s;
    ++step_;
  }
  if (req_.command == Command::kValidate && req_.nonce != kValidationMagic) {
    return Fail("VALIDATE carried magic " + Hex(req_.nonce) + " instead of " +
                Hex(kValidationMagic));
  }
  return Step::kDone;
}

}  // namespace crun::wire
