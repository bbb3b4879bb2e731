// FdWriter: writes to one file descriptor (crun's stdout or stderr) on a thread of its own, so
// that a reader who stops reading (a paused pager, a `tee` on a slow file system, a stuck log
// shipper) stops that thread and never its callers: heartbeats, keep-alives and the agent's
// event loop go on however slowly crun's output is read (docs/reliability.md).
//
// Callers hand it whole lines. It writes them in the order given, several per write() but at
// most PIPE_BUF bytes (a longer line alone), so that lines of other writers to the same pipe
// never land inside one. What is queued is bounded: TryWrite refuses lines once `limit` bytes
// wait (the caller holds back, or drops and counts), and WhenRoom says when to try again.
// Write never refuses: for what must never be lost (the failure report, fatal errors, the
// final summary), which then waits for the reader. Once a write fails for good (the reader is
// gone: EPIPE, EBADF), everything queued and later is discarded, as a blocking write that fails
// would have lost it.
//
// Thread-safe. The thread starts with the first line queued; Flush blocks until what was queued
// is out.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace crun {

// Writes whole lines to `fd`, blocking: several per write() but at most PIPE_BUF bytes (a
// longer line alone), so that no other writer's bytes land inside a line. 0, or the errno of
// the write that failed (the reader or the disk is gone).
int WriteLines(int fd, std::string_view lines);

class FdWriter {
 public:
  static constexpr std::size_t kDefaultLimit = 1 << 20;

  // Does not own `fd`.
  explicit FdWriter(int fd, std::size_t limit = kDefaultLimit);
  ~FdWriter();  // flushes, then ends the thread
  FdWriter(const FdWriter&) = delete;
  FdWriter& operator=(const FdWriter&) = delete;

  // The process's writers for its stdout and stderr, made on first use and never destroyed
  // (lines may come from any thread until the process exits); Flush them before exiting.
  static FdWriter& Stdout();
  static FdWriter& Stderr();
  // Stdout() for 1, Stderr() for 2, else null.
  static FdWriter* ForStandard(int fd);

  // Queues `lines` unless `limit` bytes wait already; false: nothing was queued.
  bool TryWrite(std::string_view lines);
  // Queues `lines` whatever waits.
  void Write(std::string_view lines);
  // Calls `ready` once, on the writer's thread, when no more than half of `limit` waits (at
  // once, on this thread, when that holds already, or when writing has failed for good).
  void WhenRoom(std::function<void()> ready);
  // Blocks until everything queued before the call is written (or discarded).
  void Flush();

  std::size_t queued() const;
  int fd() const { return fd_; }

 private:
  void Loop();
  void StartLocked();  // the thread, if it does not run yet (mu_ held)

  const int fd_;
  const std::size_t limit_;
  mutable std::mutex mu_;
  std::condition_variable wake_;     // the thread: something to write, or stop
  std::condition_variable written_;  // Flush: progress
  std::string queue_;
  std::size_t in_flight_ = 0;   // bytes the thread is writing now
  std::uint64_t accepted_ = 0;  // bytes ever queued
  std::uint64_t done_ = 0;      // bytes ever written or discarded
  bool failed_ = false;
  bool stop_ = false;
  std::vector<std::function<void()>> waiting_;  // WhenRoom's
  std::thread thread_;
};

}  // namespace crun
