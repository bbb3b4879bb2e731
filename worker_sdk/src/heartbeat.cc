#include "crun/worker/heartbeat.h"

#include <unistd.h>

#include <cstdlib>

#include "base/numbers.h"
#include "crun/worker/env_names.h"

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

}  // namespace

void Heartbeat() {
  const int fd = HeartbeatFd();
  if (fd < 0) return;
  // A full pipe (crun reads all the time, so it would have to be stuck) or a closed one loses
  // this beat, which is what a stuck reader deserves; the worker goes on either way.
  const ssize_t ignored = ::write(fd, ".", 1);
  (void)ignored;
}

}  // namespace crun::worker
