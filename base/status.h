// Status and StatusOr<T>: how crun reports failures that the network, a peer or a user can
// cause (timeouts, refused connections, malformed frames, bad values). Invariants the program
// guarantees itself are asserted instead; docs/errors.md draws the line.
//
// A Status is cheap to copy when OK (no allocation) and carries a code plus a message that
// names the host, port, key or value involved.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crun {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // a caller passed a bad value (named in the message)
  kNotFound,           // the thing asked for does not exist
  kTimeout,            // a deadline passed
  kUnavailable,        // the peer cannot be reached or the connection broke
  kProtocol,           // the peer sent bytes that break the wire protocol
  kResourceExhausted,  // a configured limit was hit
  kInternal,           // an unexpected error from the OS or a library
  kAborted,            // the caller (or its group) gave the operation up
  kPermissionDenied,   // the peer refused us: no or wrong credentials, or not on its list
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "timeout: wait for keys [/a] on 127.0.0.1:29500 timed out after 30000 ms"
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status TimeoutError(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status ProtocolError(std::string m) { return {StatusCode::kProtocol, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status PermissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}

// errno -> Status, wrapped once here: "connect to 10.0.0.5:29500: Connection refused".
Status PosixError(std::string_view context, int err);
// The same message with the code the caller's contract gives it whatever errno says (a file
// the user named that cannot be read is a bad value: kInvalidArgument, exit 2).
Status PosixError(std::string_view context, int err, StatusCode code);

// "[/a, /b, ... (1000 keys)]": key lists in messages, bounded in length.
std::string DescribeKeys(const std::vector<std::string>& keys);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "StatusOr built from an OK status carries no value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace crun

// Propagates a non-OK Status out of the calling function.
#define CRUN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::crun::Status crun_status_ = (expr);        \
    if (!crun_status_.ok()) return crun_status_; \
  } while (false)

// `lhs = value of expr`, or returns expr's Status from the calling function. `lhs` may declare
// ("auto x", "const Mode m"). For a function returning Status or a StatusOr.
#define CRUN_ASSIGN_OR_RETURN(lhs, expr) \
  CRUN_ASSIGN_OR_RETURN_IMPL_(CRUN_STATUS_CONCAT_(crun_or_, __LINE__), lhs, expr)
#define CRUN_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                \
  if (!var.ok()) return var.status();               \
  lhs = std::move(var).value()
#define CRUN_STATUS_CONCAT_(a, b) CRUN_STATUS_CONCAT_INNER_(a, b)
#define CRUN_STATUS_CONCAT_INNER_(a, b) a##b
