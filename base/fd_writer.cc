#include "base/fd_writer.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <utility>

namespace crun {
namespace {

// 0, or the errno of the write that failed for good. A descriptor that another process made
// non-blocking (it shares the file description) is waited for, not spun on.
int WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (n < 0 && errno != EINTR) {
      return errno;
    }
  }
  return 0;
}

}  // namespace

int WriteLines(int fd, std::string_view lines) {
  while (!lines.empty()) {
    std::size_t n = lines.size();
    if (n > PIPE_BUF) {
      const auto nl = lines.rfind('\n', PIPE_BUF - 1);
      n = nl != std::string_view::npos ? nl + 1 : lines.find('\n') + 1;
      if (n == 0) n = lines.size();  // one unterminated line
    }
    if (const int err = WriteAll(fd, lines.substr(0, n)); err != 0) return err;
    lines.remove_prefix(n);
  }
  return 0;
}

FdWriter::FdWriter(int fd, std::size_t limit) : fd_(fd), limit_(limit) {}

FdWriter::~FdWriter() {
  Flush();
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

FdWriter& FdWriter::Stdout() {
  static FdWriter* const writer = new FdWriter(STDOUT_FILENO);
  return *writer;
}

FdWriter& FdWriter::Stderr() {
  static FdWriter* const writer = new FdWriter(STDERR_FILENO);
  return *writer;
}

FdWriter* FdWriter::ForStandard(int fd) {
  if (fd == STDOUT_FILENO) return &Stdout();
  if (fd == STDERR_FILENO) return &Stderr();
  return nullptr;
}

bool FdWriter::TryWrite(std::string_view lines) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() + in_flight_ >= limit_ && !failed_) return false;
    accepted_ += lines.size();
    if (failed_) {
      done_ += lines.size();
      return true;
    }
    queue_.append(lines);
    StartLocked();
  }
  wake_.notify_one();
  return true;
}

void FdWriter::Write(std::string_view lines) {
  {
    std::lock_guard lock(mu_);
    accepted_ += lines.size();
    if (failed_) {
      done_ += lines.size();
      return;
    }
    queue_.append(lines);
    StartLocked();
  }
  wake_.notify_one();
}

void FdWriter::StartLocked() {
  // On the first line: a crun that writes nothing (most launches, at the default log level)
  // starts no thread.
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void FdWriter::WhenRoom(std::function<void()> ready) {
  {
    std::lock_guard lock(mu_);
    if (!failed_ && queue_.size() + in_flight_ > limit_ / 2) {
      waiting_.push_back(std::move(ready));
      return;
    }
  }
  ready();
}

void FdWriter::Flush() {
  std::unique_lock lock(mu_);
  const std::uint64_t target = accepted_;
  written_.wait(lock, [&] { return done_ >= target; });
}

std::size_t FdWriter::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size() + in_flight_;
}

void FdWriter::Loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, with nothing left
    std::string chunk;
    chunk.swap(queue_);
    in_flight_ = chunk.size();
    lock.unlock();
    const int err = WriteLines(fd_, chunk);
    lock.lock();
    in_flight_ = 0;
    done_ += chunk.size();
    if (err != 0) {  // the reader is gone: what waits, and what comes, goes nowhere
      failed_ = true;
      done_ += queue_.size();
      queue_.clear();
    }
    std::vector<std::function<void()>> ready;
    if (failed_ || queue_.size() <= limit_ / 2) ready.swap(waiting_);
    written_.notify_all();
    lock.unlock();
    for (auto& r : ready) r();
    lock.lock();
  }
}

}  // namespace crun
