#include "agent/supervise/tool_run.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <utility>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/supervise/exit_watcher.h"
#include "agent/supervise/spawn.h"
#include "base/status.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;
constexpr std::size_t kMaxOutput = std::size_t{4} << 20;

class Run : public std::enable_shared_from_this<Run> {
 public:
  using Done = std::function<void(ToolResult)>;
  Run(asio::io_context& io, ChildRegistry& children, Done done)
      : io_(io), children_(children), pipe_(io), deadline_(io), done_(std::move(done)) {}

  void Begin(ToolSpec tool, std::chrono::milliseconds deadline) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Fail(PosixError("pipe", errno).message());
    ProcessSpec spec;
    spec.argv = std::move(tool.argv);
    spec.envp = tool.envp.empty() ? std::vector<std::string>{"PATH=/usr/bin:/bin", "LC_ALL=C"}
                                  : std::move(tool.envp);
    spec.stdout_fd = p[1];
    spec.stderr_fd = p[1];
    auto pid = SpawnProcess(spec, children_);
    ::close(p[1]);
    if (!pid.ok()) {
      ::close(p[0]);
      return Fail(pid.status().message());
    }
    pid_ = *pid;
    result_.started = true;
    pipe_.assign(p[0]);
    auto self = shared_from_this();
    auto watcher = ExitWatcher::Watch(io_, pid_, children_, [self](ExitStatus s) {
      self->result_.exit = s;
      self->exited_ = true;
      self->MaybeDone();
    });
    if (!watcher.ok()) {
      KillAndReap(pid_, children_);
      boost::system::error_code ec;
      pipe_.close(ec);
      result_.started = false;
      return Fail(watcher.status().message());
    }
    watcher_ = std::move(watcher).value();
    deadline_.expires_after(deadline);
    deadline_.async_wait([self](const boost::system::error_code& ec) {
      if (ec || self->exited_) {
        // Exited, but something it left holds the pipe: what was read is the output.
        if (!ec && !self->eof_) self->Close();
        return;
      }
      self->result_.timed_out = true;
      ::kill(-self->pid_, SIGKILL);
    });
    Read();
  }

  void Kill() {
    if (pid_ > 0 && !exited_) ::kill(-pid_, SIGKILL);
  }

 private:
  void Read() {
    auto self = shared_from_this();
    pipe_.async_read_some(asio::buffer(chunk_),
                          [self](const boost::system::error_code& ec, std::size_t n) {
                            if (ec) {
                              self->eof_ = true;
                              return self->MaybeDone();
                            }
                            if (self->result_.output.size() < kMaxOutput)
                              self->result_.output.append(self->chunk_, n);
                            self->Read();
                          });
  }

  // The deadline passed after the exit, with the pipe still open.
  void Close() {
    eof_ = true;
    boost::system::error_code ec;
    pipe_.close(ec);
    MaybeDone();
  }

  void MaybeDone() {
    if (!exited_ || !done_) return;
    // A killed run ends at its exit: a descendant may hold the pipe for ever.
    if (!eof_ && !result_.timed_out) return;
    deadline_.cancel();
    boost::system::error_code ec;
    pipe_.close(ec);
    std::exchange(done_, nullptr)(std::move(result_));
  }

  void Fail(std::string why) {
    result_.error = std::move(why);
    auto done = std::exchange(done_, nullptr);
    asio::post(io_, [done, r = std::move(result_)]() mutable { done(std::move(r)); });
  }

  asio::io_context& io_;
  ChildRegistry& children_;
  asio::posix::stream_descriptor pipe_;
  asio::steady_timer deadline_;
  Done done_;
  pid_t pid_ = 0;
  std::unique_ptr<ExitWatcher> watcher_;
  ToolResult result_;
  bool exited_ = false, eof_ = false;
  char chunk_[16384];
};

}  // namespace

std::function<void()> RunTool(asio::io_context& io, ChildRegistry& children, ToolSpec spec,
                              std::chrono::milliseconds deadline,
                              std::function<void(ToolResult)> done) {
  auto run = std::make_shared<Run>(io, children, std::move(done));
  run->Begin(std::move(spec), deadline);
  return [weak = std::weak_ptr<Run>(run)] {
    if (auto r = weak.lock()) r->Kill();
  };
}

}  // namespace crun::agent
