#include "crun/worker/heartbeat.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "base/numbers.h"
#include "base/step_records.h"
#include "crun/worker/env_names.h"
#include "worker_sdk/src/step_clock.h"

namespace crun::worker {
namespace {

// The descriptor, read once: -1 when crun gave none (or a malformed one).
int HeartbeatFd() {
  static const int fd = [] {
    const char* v = std::getenv(env::kCrunHeartbeatFd);
    if (v == nullptr) return -1;
    const auto parsed = ParseInteger(v, 3, 1 << 20);
    return parsed ? static_cast<int>(*parsed) : -1;
  }();
  return fd;
}

// A write of one beat or one record: at most PIPE_BUF bytes, so all of it or none.
void Send(int fd, const std::string& bytes) {
  const ssize_t ignored = ::write(fd, bytes.data(), bytes.size());
  (void)ignored;
}

std::atomic<std::int64_t> collective_wait_ns{0};

}  // namespace

namespace internal {

void AddCollectiveWait(StepClock::duration waited) {
  collective_wait_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count(),
                               std::memory_order_relaxed);
}

StepClock::duration CollectiveWaitSoFar() {
  return std::chrono::nanoseconds(collective_wait_ns.load(std::memory_order_relaxed));
}

}  // namespace internal

void Step(std::int64_t step) {
  const int fd = HeartbeatFd();
  if (fd < 0) return;
  static std::mutex mu;
  static std::optional<internal::StepClock::time_point> last;
  static internal::StepClock::duration waited_at_last{};
  std::lock_guard lock(mu);
  const auto now = internal::StepClock::now();
  const auto waited = internal::CollectiveWaitSoFar();
  if (!last) {
    Send(fd, FormatStepRecord({step, std::nullopt}));  // the step resumed at; no compute yet
  } else {
    const auto compute = (now - *last) - (waited - waited_at_last);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(compute).count();
    Send(fd, FormatStepRecord({step, us > 0 ? us : 0}));
  }
  last = now;
  waited_at_last = waited;
}

void Heartbeat() {
  const int fd = HeartbeatFd();
  if (fd < 0) return;
  // A full pipe (crun reads all the time, so it would have to be stuck) or a closed one loses
  // this beat, which is what a stuck reader deserves; the worker goes on either way.
  Send(fd, ".");
}

}  // namespace crun::worker
