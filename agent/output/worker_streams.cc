#include "agent/output/worker_streams.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>

#include <spdlog/spdlog.h>

#include "base/fd_writer.h"
#include "base/status.h"

namespace crun::agent {
namespace {

std::string ReplaceAll(std::string s, const std::string& what, const std::string& with) {
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + with.size())) {
    s.replace(at, what.size(), with);
  }
  return s;
}

int BitFor(const std::vector<int>& masks, int lr) {
  return lr < static_cast<int>(masks.size()) ? masks[static_cast<std::size_t>(lr)] : 0;
}

}  // namespace

std::vector<std::string> FileTail(const std::string& path, std::size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  return {tail.begin(), tail.end()};
}

WorkerStreams::WorkerStreams(boost::asio::io_context& io, StreamOptions options)
    : io_(io), options_(std::move(options)) {}

WorkerStreams::~WorkerStreams() { EndAttempt(); }

void WorkerStreams::BeginAttempt(const std::string& attempt_dir) {
  EndAttempt();
  auto open = [&](const std::vector<std::string>& filters, const char* name) {
    if (filters.empty()) return -1;
    const std::string path = attempt_dir + "/" + name;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) spdlog::warn("{}", PosixError("cannot write " + path, errno).message());
    return fd;
  };
  filtered_out_ = open(options_.stdout_filters, "filtered_stdout.log");
  filtered_err_ = open(options_.stderr_filters, "filtered_stderr.log");
}

void WorkerStreams::EndAttempt() {
  for (int* fd : {&filtered_out_, &filtered_err_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

std::string WorkerStreams::PrefixOf(const StreamOwner& owner) const {
  std::string p = ReplaceAll(options_.prefix_template, "${role_name}", owner.role);
  p = ReplaceAll(p, "${rank}", std::to_string(owner.rank));
  p = ReplaceAll(p, "${local_rank}", std::to_string(owner.local_rank));
  return ReplaceAll(p, "${hostname}", options_.host_name);
}

std::unique_ptr<LinePump> WorkerStreams::Route(const StreamOwner& owner, int bit, int* child_fd,
                                               std::vector<int>* child_fds,
                                               std::function<void()> on_eof,
                                               std::shared_ptr<std::uint64_t> progress) {
  const int lr = owner.local_rank;
  const auto& ranks = options_.console_ranks;
  const bool shown = ranks.empty() || std::find(ranks.begin(), ranks.end(), lr) != ranks.end();
  const bool tee = BitFor(options_.tees, lr) & bit;
  const bool redirect = (BitFor(options_.redirects, lr) & bit) && !tee;
  const auto& filters = bit == 1 ? options_.stdout_filters : options_.stderr_filters;
  const std::string path = owner.dir + (bit == 1 ? "/stdout.log" : "/stderr.log");
  int file = -1;
  if (tee || redirect) {
    file = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (file < 0) spdlog::warn("{}", PosixError("cannot write " + path, errno).message());
  }
  if (redirect && file >= 0 && filters.empty() && !options_.pump_all) {
    *child_fd = file;
    child_fds->push_back(file);
    return nullptr;
  }
  if (!tee && !redirect && bit == 1 && filters.empty() && !options_.pump_all) {
    // stdout untouched: the worker writes to crun's own
    if (!shown) {
      *child_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
      child_fds->push_back(*child_fd);
    }
    return nullptr;
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    spdlog::warn("{}: it writes to crun's console",
                 PosixError("local rank " + std::to_string(lr) + ": no pipe for its output", errno)
                     .message());
    if (file >= 0) ::close(file);
    return nullptr;
  }
  *child_fd = p[1];
  child_fds->push_back(p[1]);
  PumpTargets targets;
  targets.console_fd = shown && !redirect ? (bit == 1 ? STDOUT_FILENO : STDERR_FILENO) : -1;
  // Through crun's writer for its stdout or stderr: a stalled reader holds back this worker,
  // never the agent's event loop (base/fd_writer.h).
  if (targets.console_fd >= 0) targets.console_writer = FdWriter::ForStandard(targets.console_fd);
  if (tee) targets.prefix = PrefixOf(owner);
  targets.file_fd = file;
  targets.progress = std::move(progress);
  targets.bytes = bit == 1 ? options_.stdout_bytes : options_.stderr_bytes;
  targets.file_path = path;
  targets.stream_name = "rank " + std::to_string(owner.rank) + (bit == 1 ? " stdout" : " stderr");
  if (!filters.empty()) {
    targets.filters = filters;
    targets.filtered_fd = bit == 1 ? filtered_out_ : filtered_err_;
    targets.filtered_prefix = PrefixOf(owner);
  }
  return std::make_unique<LinePump>(io_, p[0], targets, [file, on_eof = std::move(on_eof)] {
    if (file >= 0) ::close(file);
    on_eof();
  });
}

}  // namespace crun::agent
