// WriteQueue: the messages waiting for a stream that takes one write at a time (a gRPC
// stream, for the agent's session client). Push may be called from any thread; the reactor
// starts the write Push or Done hands back. The element handed back is the one in flight: it
// stays in place until the next Done (gRPC's callback API reads it until OnWriteDone).
// An idle queue holds no heap (std::deque would hold about 600 bytes).
#pragma once

#include <mutex>
#include <optional>

#include "base/small_fifo.h"

namespace crun {

template <typename Message>
class WriteQueue {
 public:
  // Queues `m`; returns it if the stream is idle (the caller starts that write), else nullptr.
  const Message* Push(Message m) {
    std::lock_guard lock(mu_);
    if (closed_) return nullptr;
    if (current_) {
      pending_.push_back(std::move(m));
      return nullptr;
    }
    current_.emplace(std::move(m));
    return &*current_;
  }
  // The write in flight completed; returns the next one to start, or nullptr (idle now).
  const Message* Done() {
    std::lock_guard lock(mu_);
    current_.reset();
    if (pending_.empty() || (closed_ && !drain_)) {
      pending_.release();
      return nullptr;
    }
    current_.emplace(pending_.take_front());
    return &*current_;
  }
  // No more pushes. With `drain` the queued messages are still written, else they are
  // dropped (the stream failed). Returns true if no write is in flight.
  bool Close(bool drain = false) {
    std::lock_guard lock(mu_);
    closed_ = true;
    drain_ = drain;
    return !current_;
  }

 private:
  std::mutex mu_;
  std::optional<Message> current_;  // the write in flight
  SmallFifo<Message> pending_;      // after it, in order
  bool closed_ = false;
  bool drain_ = false;
};

}  // namespace crun
