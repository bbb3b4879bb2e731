#include "agent/hangs/file_timer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace crun::agent {
namespace {

double WallSeconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// A line longer than this is not a timer request (PyTorch's client refuses anything over
// PIPE_BUF); it is dropped rather than buffered without bound.
constexpr std::size_t kMaxLine = 64 * 1024;

}  // namespace

StatusOr<std::unique_ptr<FileTimerServer>> FileTimerServer::Open(boost::asio::io_context& io,
                                                                 const std::string& path,
                                                                 OnRequest on_request,
                                                                 OnExpired on_expired) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISFIFO(st.st_mode)) {
      return InvalidArgument("TORCHELASTIC_TIMER_FILE=" + path +
                             " exists and is not a named pipe: crun will not replace it");
    }
    ::unlink(path.c_str());
  }
  if (::mkfifo(path.c_str(), 0600) != 0) {
    return PosixError("cannot make the file-timer pipe TORCHELASTIC_TIMER_FILE=" + path, errno);
  }
  // Read and write: the pipe never reads as EOF when the last client closes it, and opening
  // does not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return PosixError("cannot open the file-timer pipe " + path, err);
  }
  return std::unique_ptr<FileTimerServer>(
      new FileTimerServer(io, path, fd, std::move(on_request), std::move(on_expired)));
}

FileTimerServer::FileTimerServer(boost::asio::io_context& io, std::string path, int fd,
                                 OnRequest on_request, OnExpired on_expired)
    : path_(std::move(path)),
      pipe_(io, fd),
      alarm_(io),
      on_request_(std::move(on_request)),
      on_expired_(std::move(on_expired)) {
  Read();
}

FileTimerServer::~FileTimerServer() {
  boost::system::error_code ignored;
  pipe_.close(ignored);
  alarm_.cancel();
  ::unlink(path_.c_str());
}

void FileTimerServer::Clear() {
  timers_.clear();
  alarm_.cancel();
}

void FileTimerServer::Read() {
  pipe_.async_read_some(boost::asio::buffer(buffer_), [this](const boost::system::error_code& ec,
                                                             std::size_t n) {
    if (ec) return;  // closed with the server
    pending_.append(buffer_, n);
    std::size_t start = 0;
    for (auto nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n', start)) {
      Handle(std::string_view(pending_).substr(start, nl - start));
      start = nl + 1;
    }
    pending_.erase(0, start);
    if (pending_.size() > kMaxLine) {
      ++malformed_;
      pending_.clear();
    }
    Schedule();
    Read();
  });
}

void FileTimerServer::Handle(std::string_view line) {
  if (line.empty()) return;
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  const bool valid = j.is_object() && j.contains("pid") && j["pid"].is_number_integer() &&
                     j.contains("scope_id") && j["scope_id"].is_string() &&
                     j.contains("expiration_time") && j["expiration_time"].is_number();
  if (!valid) {
    if (malformed_++ == 0) {
      spdlog::warn("file timer {}: ignoring a request that is not torchelastic's: {:.200}", path_,
                   line);
    }
    return;
  }
  const auto pid = j["pid"].get<pid_t>();
  auto key = std::make_pair(pid, j["scope_id"].get<std::string>());
  const double expiration = j["expiration_time"].get<double>();
  if (expiration < 0 || !std::isfinite(expiration)) {
    timers_.erase(key);
  } else {
    Timer t;
    t.expiration = expiration;
    if (j.contains("signal") && j["signal"].is_number_integer()) t.signal = j["signal"].get<int>();
    timers_[std::move(key)] = t;
  }
  on_request_(pid);
}

void FileTimerServer::Schedule() {
  if (timers_.empty()) {
    alarm_.cancel();
    return;
  }
  double first = timers_.begin()->second.expiration;
  for (const auto& [key, t] : timers_) first = std::min(first, t.expiration);
  const double delay = std::max(0.0, first - WallSeconds());
  alarm_.expires_after(std::chrono::microseconds(static_cast<long long>(delay * 1e6)));
  alarm_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Fire();
  });
}

void FileTimerServer::Fire() {
  const double now = WallSeconds();
  for (auto it = timers_.begin(); it != timers_.end();) {
    if (it->second.expiration > now) {
      ++it;
      continue;
    }
    const auto [pid, scope] = it->first;
    char late[32];
    std::snprintf(late, sizeof late, "%.1f", now - it->second.expiration);
    it = timers_.erase(it);
    on_expired_(pid, "torchelastic timer '" + scope + "' of pid " + std::to_string(pid) +
                         " expired " + late + " s ago");
  }
  Schedule();
}

}  // namespace crun::agent
