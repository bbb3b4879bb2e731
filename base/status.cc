#include "base/status.h"

#include <cstring>

namespace crun {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kProtocol:
      return "protocol error";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kInternal:
      return "internal error";
    case StatusCode::kAborted:
      return "aborted";
    case StatusCode::kPermissionDenied:
      return "permission denied";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

namespace {

// The code an errno value stands for where the caller gives none.
StatusCode CodeOf(int err) {
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case ENOTCONN:
      code = StatusCode::kUnavailable;
      break;
    case ETIMEDOUT:
      code = StatusCode::kTimeout;
      break;
    case ENOENT:
      code = StatusCode::kNotFound;
      break;
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOBUFS:
      code = StatusCode::kResourceExhausted;
      break;
    case EINVAL:
    case EADDRINUSE:
    case EADDRNOTAVAIL:
    case EAFNOSUPPORT:
      code = StatusCode::kInvalidArgument;
      break;
    default:
      break;
  }
  return code;
}

}  // namespace

Status PosixError(std::string_view context, int err, StatusCode code) {
  return Status(code, std::string(context) + ": " + std::strerror(err));
}

Status PosixError(std::string_view context, int err) {
  return PosixError(context, err, CodeOf(err));
}

std::string DescribeKeys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (std::size_t i = 0; i < keys.size() && i < 8; ++i) {
    if (i > 0) out += ", ";
    out += keys[i].size() > 128 ? keys[i].substr(0, 128) + "..." : keys[i];
  }
  if (keys.size() > 8) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out + "]";
}

}  // namespace crun
