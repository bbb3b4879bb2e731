// LinePump: carries one worker stream (a pipe) to its destinations line by line: a file, the
// console (with a prefix such as "[default3]:"), or both, and keeps the last lines for the
// failure report. Lines are written whole, several per write() up to PIPE_BUF bytes (a longer
// line alone), so lines of different workers never interleave mid-line. Runs on the agent's
// event loop; a line with no newline at EOF is flushed as one.
//
// The console goes through an FdWriter (base/fd_writer.h) when one is given: the event loop
// never waits for whoever reads crun's output. When the writer's queue is full (that reader
// stalled), the pump holds its lines and stops reading its pipe until the writer has room
// again, so that the worker that writes blocks on its full pipe, as under torchrun, and the
// agent does not. Held lines are never dropped: at EOF, or when the pump is destroyed, they are
// queued whatever waits.
//
// A worker that prints fast would wake crun for every line it writes (the pipe wakes its
// reader on each write: 5 us of system time a line here, which the worker pays too). After
// each read the pump therefore leaves the pipe alone for a millisecond, unwatched, so that a
// burst arrives in a few reads; a line is shown at most a millisecond later.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "base/fd_writer.h"
#include "metrics/registry.h"

namespace crun::agent {

struct PumpTargets {
  int console_fd = -1;                 // -1: not shown on the console
  FdWriter* console_writer = nullptr;  // set: console lines go through it (console_fd unused)
  std::string prefix;                  // put before each console line
  int file_fd = -1;                    // -1: no file; the pump does not own it
  std::string file_path;    // for the warning when the file cannot be written (disk full)
  std::string stream_name;  // "rank 3 stdout", for that warning
  std::size_t tail_lines = 20;
  // Lines containing any of `filters` also go to filtered_fd (not owned), with filtered_prefix.
  std::vector<std::string> filters;
  int filtered_fd = -1;
  std::string filtered_prefix;
  // Counts reads: the worker's progress for hang detection (hang_watch.h); null: not counted.
  std::shared_ptr<std::uint64_t> progress;
  metrics::Counter* bytes = nullptr;  // counts the bytes read; null: not counted
};

class LinePump {
 public:
  // Takes ownership of `read_fd`. `on_eof` runs once, when every writer has closed the pipe.
  LinePump(boost::asio::io_context& io, int read_fd, PumpTargets targets,
           std::function<void()> on_eof);
  ~LinePump();
  LinePump(const LinePump&) = delete;
  LinePump& operator=(const LinePump&) = delete;

  const std::deque<std::string>& tail() const { return tail_; }
  // Reads what the pipe holds right now, without waiting: a worker that just exited has
  // written its last lines, and the failure report wants them before the event loop would
  // get to them.
  void DrainAvailable();

 private:
  void Read();
  void Pause();  // after a read: the pipe unwatched for a millisecond, then Read()
  void Consume(std::size_t n);
  // A line to each target, gathered; Flush writes what was gathered, one write per target
  // per read (not one per line: a worker printing 200,000 lines a second would otherwise cost
  // crun a system call each).
  void Emit(std::string_view line);
  // `force`: console lines are queued whatever waits (EOF, destruction).
  void Flush(bool force = false);
  // The console writer was full: read again once it has room.
  void WaitForConsole();

  int fd_;                                      // the pipe's read end; -1 once closed
  boost::asio::posix::stream_descriptor pipe_;  // holds fd_ while watched
  boost::asio::steady_timer pause_;
  // Expires with this pump: a handler whose operation completed before the pump was destroyed
  // (queued in the same turn of the loop) sees it and does nothing.
  std::shared_ptr<const char> alive_ = std::make_shared<const char>('\0');
  PumpTargets targets_;
  std::function<void()> on_eof_;
  bool file_failed_ = false;   // a write failed: warned once, the file gets no more lines
  bool console_held_ = false;  // to_console_ waits for room in the console writer
  // What the console writer's thread calls back through: the loop to post to, and this pump,
  // both cleared (under mu) when the pump is destroyed.
  struct ConsoleWait {
    std::mutex mu;
    boost::asio::io_context* io = nullptr;
    LinePump* pump = nullptr;
  };
  std::shared_ptr<ConsoleWait> wait_;
  std::string pending_;
  std::deque<std::string> tail_;
  std::string to_file_, to_console_, to_filtered_;
  char buffer_[16384];
};

}  // namespace crun::agent
