#include "agent/hangs/stack_pipe.h"

#include <signal.h>

#include "agent/hangs/python_hook.h"

namespace crun::agent {

namespace asio = boost::asio;

StatusOr<std::unique_ptr<StackPipe>> StackPipe::Create(asio::io_context& io) {
  auto self = std::unique_ptr<StackPipe>(new StackPipe(io));
  auto pipe =
      WorkerPipe::Create(io, [raw = self.get()](std::string_view data) { raw->OnData(data); });
  if (!pipe.ok()) return pipe.status();
  self->pipe_ = std::move(pipe).value();
  return self;
}

StackPipe::StackPipe(asio::io_context& io) : step_timer_(io), deadline_timer_(io) {}

StackPipe::~StackPipe() { Finish(); }

void StackPipe::OnData(std::string_view data) {
  if (!done_) return;  // nobody asked: a stray write (a late answer to an earlier request)
  constexpr std::size_t kMax = std::size_t{4} << 20;
  buffer_.append(data.substr(0, kMax - std::min(buffer_.size(), kMax)));
  // A complete safe dump is the answer, even one that came after the at-once signal was sent
  // (the two may then be interleaved in the buffer: the marked one is whole).
  if (const auto begin = buffer_.find(kDumpBegin); begin != std::string::npos) {
    const auto from = begin + kDumpBegin.size();
    if (const auto end = buffer_.find(kDumpEnd, from); end != std::string::npos) {
      buffer_ = buffer_.substr(from, end - from);
      at_once_ = false;  // the answer is the safe one
      return Finish();
    }
    if (!at_once_) return;  // the rest of the safe dump is on its way
  }
  if (!at_once_) return;
  step_timer_.expires_after(quiet_);
  step_timer_.async_wait([this](const boost::system::error_code& e) {
    if (!e) Finish();
  });
}

void StackPipe::Request(pid_t pid, Timing timing, std::function<void(std::string, bool)> done) {
  if (done_) Finish();  // one request at a time: the earlier one ends with what it has
  buffer_.clear();
  pid_ = pid;
  at_once_ = false;
  quiet_ = timing.quiet;
  done_ = std::move(done);
  // Room for a large dump (the default 64 KiB holds about 60 threads of 20 frames): the
  // writer may be a signal handler that must not block, so it writes non-blocking, and
  // anything past a full pipe would be lost. Asked for here, not when every worker starts.
  ::fcntl(pipe_->read_fd(), F_SETPIPE_SZ, 1 << 20);
  deadline_timer_.expires_after(timing.deadline);
  deadline_timer_.async_wait([this](const boost::system::error_code& e) {
    if (!e) Finish();
  });
  const StackSignals signals = HookSignals();
  if (!Catches(pid, signals.safe) || ::kill(pid, signals.safe) != 0) return AskAtOnce();
  step_timer_.expires_after(timing.safe_wait);
  step_timer_.async_wait([this](const boost::system::error_code& e) {
    if (!e && buffer_.find(kDumpBegin) == std::string::npos) AskAtOnce();
  });
}

void StackPipe::AskAtOnce() {
  at_once_ = true;
  if (!Catches(pid_, HookSignals().at_once) || ::kill(pid_, HookSignals().at_once) != 0) {
    return Finish();
  }
}

void StackPipe::Finish() {
  step_timer_.cancel();
  deadline_timer_.cancel();
  const bool at_once = std::exchange(at_once_, false);
  if (auto done = std::exchange(done_, nullptr)) done(std::exchange(buffer_, {}), at_once);
}

}  // namespace crun::agent
