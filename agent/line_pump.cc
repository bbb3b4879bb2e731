#include "agent/line_pump.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

namespace crun::agent {
namespace {

// 0, or the errno of the write that failed.
int WriteAll(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      return errno;  // the console or file is gone: the worker must not be blocked by it
    }
  }
  return 0;
}

}  // namespace

LinePump::LinePump(boost::asio::io_context& io, int read_fd, PumpTargets targets,
                   std::function<void()> on_eof)
    : pipe_(io, read_fd), targets_(std::move(targets)), on_eof_(std::move(on_eof)) {
  Read();
}

void LinePump::Read() {
  pipe_.async_read_some(boost::asio::buffer(buffer_),
                        [this](const boost::system::error_code& ec, std::size_t n) {
                          if (ec == boost::asio::error::operation_aborted) return;
                          if (ec) {  // EOF: the worker and everything it started are gone
                            if (!pending_.empty()) Emit(pending_);
                            pending_.clear();
                            boost::system::error_code ignored;
                            pipe_.close(ignored);
                            if (on_eof_) std::exchange(on_eof_, nullptr)();
                            return;
                          }
                          Consume(n);
                          Read();
                        });
}

void LinePump::Consume(std::size_t n) {
  if (targets_.progress) ++*targets_.progress;
  pending_.append(buffer_, n);
  std::size_t start = 0;
  for (auto nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n', start)) {
    Emit(std::string_view(pending_).substr(start, nl - start));
    start = nl + 1;
  }
  pending_.erase(0, start);
}

void LinePump::DrainAvailable() {
  if (!pipe_.is_open()) return;
  const int fd = pipe_.native_handle();
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && !(flags & O_NONBLOCK)) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  for (;;) {
    const ssize_t n = ::read(fd, buffer_, sizeof buffer_);
    if (n > 0) {
      Consume(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;  // empty for now (EAGAIN), or EOF, which the pending read will see
    }
  }
}

void LinePump::Emit(std::string_view line) {
  if (targets_.file_fd >= 0 && !file_failed_) {
    if (const int err = WriteAll(targets_.file_fd, std::string(line) + "\n"); err != 0) {
      // Disk full, quota, I/O error: say so once; the console (if shown) still has it all.
      file_failed_ = true;
      spdlog::warn("cannot write {} to {}: {}; from here on it goes {}", targets_.stream_name,
                   targets_.file_path, std::strerror(err),
                   targets_.console_fd >= 0 ? "to the console only" : "nowhere");
    }
  }
  if (targets_.console_fd >= 0) {
    WriteAll(targets_.console_fd, targets_.prefix + std::string(line) + "\n");
  }
  if (targets_.filtered_fd >= 0) {
    for (const auto& f : targets_.filters) {
      if (line.find(f) != std::string_view::npos) {
        WriteAll(targets_.filtered_fd, targets_.filtered_prefix + std::string(line) + "\n");
        break;
      }
    }
  }
  if (targets_.tail_lines > 0) {
    tail_.emplace_back(line);
    if (tail_.size() > targets_.tail_lines) tail_.pop_front();
  }
}

}  // namespace crun::agent
