#include "agent/output/line_pump.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include "agent/output/pipe_pause.h"
#include "base/status.h"

namespace crun::agent {
LinePump::LinePump(boost::asio::io_context& io, int read_fd, PumpTargets targets,
                   std::function<void()> on_eof)
    : fd_(read_fd),
      pipe_(io, read_fd),
      pause_(io),
      targets_(std::move(targets)),
      on_eof_(std::move(on_eof)),
      wait_(std::make_shared<ConsoleWait>()) {
  wait_->io = &io;
  wait_->pump = this;
  Read();
}

LinePump::~LinePump() {
  Flush(/*force=*/true);  // lines held for a stalled console are never dropped
  {
    std::lock_guard lock(wait_->mu);
    wait_->io = nullptr;
    wait_->pump = nullptr;
  }
  pause_.cancel();
  if (!pipe_.is_open() && fd_ >= 0) ::close(fd_);  // released for a pause
}

void LinePump::Pause() {
  PausePipe(
      pipe_, fd_, pause_, alive_, [this] { Read(); },
      [this] {  // cannot watch it again: end as at EOF, with what came
        if (!pending_.empty()) Emit(pending_);
        pending_.clear();
        Flush(/*force=*/true);
        ::close(fd_);
        fd_ = -1;
        if (on_eof_) std::exchange(on_eof_, nullptr)();
      });
}

void LinePump::Read() {
  pipe_.async_read_some(boost::asio::buffer(buffer_),
                        [this, owner = std::weak_ptr<const void>(
                                   alive_)](const boost::system::error_code& ec, std::size_t n) {
                          // Cancelled, or the pump destroyed after the read had completed.
                          if (ec == boost::asio::error::operation_aborted || owner.expired()) {
                            return;
                          }
                          if (ec) {  // EOF: the worker and everything it started are gone
                            if (!pending_.empty()) Emit(pending_);
                            pending_.clear();
                            Flush(/*force=*/true);
                            boost::system::error_code ignored;
                            pipe_.close(ignored);
                            fd_ = -1;
                            if (on_eof_) std::exchange(on_eof_, nullptr)();
                            return;
                          }
                          Consume(n);
                          if (console_held_) return WaitForConsole();
                          Pause();
                        });
}

void LinePump::WaitForConsole() {
  // The writer calls back on its thread, possibly (at once) on this one; the pump and even its
  // loop may be gone by then.
  targets_.console_writer->WhenRoom([wait = wait_] {
    std::lock_guard lock(wait->mu);
    if (wait->io == nullptr) return;
    boost::asio::post(*wait->io, [wait] {
      LinePump* pump = wait->pump;  // cleared on this thread, the loop's
      if (pump == nullptr) return;
      pump->Flush();
      if (pump->console_held_) return pump->WaitForConsole();
      pump->Read();
    });
  });
}

void LinePump::Consume(std::size_t n) {
  if (targets_.progress) ++*targets_.progress;
  if (targets_.bytes != nullptr) targets_.bytes->Inc(static_cast<double>(n));
  pending_.append(buffer_, n);
  std::size_t start = 0;
  for (auto nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n', start)) {
    Emit(std::string_view(pending_).substr(start, nl - start));
    start = nl + 1;
  }
  pending_.erase(0, start);
  Flush();
}

void LinePump::DrainAvailable() {
  if (fd_ < 0) return;
  const int fd = fd_;
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
    to_file_.append(line);
    to_file_ += '\n';
  }
  if (targets_.console_fd >= 0 || targets_.console_writer != nullptr) {
    to_console_ += targets_.prefix;
    to_console_.append(line);
    to_console_ += '\n';
  }
  if (targets_.filtered_fd >= 0) {
    for (const auto& f : targets_.filters) {
      if (line.find(f) != std::string_view::npos) {
        to_filtered_ += targets_.filtered_prefix;
        to_filtered_.append(line);
        to_filtered_ += '\n';
        break;
      }
    }
  }
  if (targets_.tail_lines > 0) {
    tail_.emplace_back(line);
    if (tail_.size() > targets_.tail_lines) tail_.pop_front();
  }
}

void LinePump::Flush(bool force) {
  if (!to_file_.empty()) {
    if (const int err = WriteLines(targets_.file_fd, to_file_); err != 0) {
      // Disk full, quota, I/O error: say so once; the console (if shown) still has it all.
      file_failed_ = true;
      spdlog::warn("{}; from here on it goes {}",
                   PosixError("cannot write " + targets_.stream_name + " to " + targets_.file_path,
                              err)
                       .message(),
                   targets_.console_fd >= 0 || targets_.console_writer != nullptr
                       ? "to the console only"
                       : "nowhere");
    }
    to_file_.clear();
  }
  if (!to_console_.empty()) {
    if (FdWriter* w = targets_.console_writer; w != nullptr) {
      console_held_ = !force && !w->TryWrite(to_console_);
      if (force) w->Write(to_console_);
      if (!console_held_) to_console_.clear();
    } else {
      WriteLines(targets_.console_fd, to_console_);
      to_console_.clear();
    }
  }
  if (!to_filtered_.empty()) {
    WriteLines(targets_.filtered_fd, to_filtered_);
    to_filtered_.clear();
  }
}

}  // namespace crun::agent
