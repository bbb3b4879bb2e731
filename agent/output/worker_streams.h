// Where each worker's stdout and stderr go (docs/cli.md, Logs): crun's console as they are,
// a file (--redirects), both with a prefix (--tee, the line-prefix template), a shared
// filtered_*.log (the duplicate filters), /dev/null (--local-ranks-filter); stderr is kept for
// the failure report. One WorkerStreams per agent, on its event loop; an attempt opens its
// files with BeginAttempt and routes each stream of each worker with Route.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/output/line_pump.h"

namespace crun::agent {

struct StreamOptions {
  std::vector<int> redirects;      // per local rank: 1 stdout, 2 stderr to the file only
  std::vector<int> tees;           // per local rank: to the file and the console, prefixed
  std::vector<int> console_ranks;  // empty: every local rank reaches the console
  std::string prefix_template;     // ${role_name}, ${rank}, ${local_rank}, ${hostname}
  std::vector<std::string> stdout_filters, stderr_filters;
  std::string host_name;
  // Every stream goes through crun (a pump), even one that could go straight to the console or
  // a file: hang detection counts the worker's output as progress.
  bool pump_all = false;
  // Bytes read from the workers' stdout and stderr (pumped streams only); null: not counted.
  metrics::Counter* stdout_bytes = nullptr;
  metrics::Counter* stderr_bytes = nullptr;
};

// Who a stream belongs to, for its prefix and messages.
struct StreamOwner {
  std::string role;
  int rank = 0;
  int local_rank = 0;
  std::string dir;  // the worker's log directory: stdout.log, stderr.log
};

class WorkerStreams {
 public:
  WorkerStreams(boost::asio::io_context& io, StreamOptions options);
  ~WorkerStreams();
  WorkerStreams(const WorkerStreams&) = delete;
  WorkerStreams& operator=(const WorkerStreams&) = delete;

  // Opens attempt_dir/filtered_{stdout,stderr}.log (when there are filters) for the attempt.
  void BeginAttempt(const std::string& attempt_dir);
  // Closes them; the pumps of the attempt have ended.
  void EndAttempt();

  // Routes stream `bit` (1 stdout, 2 stderr) of `owner`: sets *child_fd to what the worker
  // gets as that stream (left as is: crun's own) and adds to *child_fds the descriptors crun
  // closes once the worker has them. Returns the pump that reads it, or null when none does;
  // `on_eof` runs when a pump has read everything (every writer closed the pipe).
  // `progress` (may be null) counts what the pump reads.
  std::unique_ptr<LinePump> Route(const StreamOwner& owner, int bit, int* child_fd,
                                  std::vector<int>* child_fds, std::function<void()> on_eof,
                                  std::shared_ptr<std::uint64_t> progress = nullptr);

  // The console prefix of `owner`'s lines: the template with its macros filled in.
  std::string PrefixOf(const StreamOwner& owner) const;

 private:
  boost::asio::io_context& io_;
  StreamOptions options_;
  int filtered_out_ = -1, filtered_err_ = -1;  // this attempt's filtered_*.log
};

// The last `lines` lines of a file (a redirected stderr.log), for the failure report.
std::vector<std::string> FileTail(const std::string& path, std::size_t lines);

}  // namespace crun::agent
