// WriteQueue: the messages waiting for a stream that takes one write at a time (a gRPC
// stream, for the rendezvous service and the agent's client). Push
// may be called from any thread; the reactor starts the write Push or Done hands back. The
// element handed back stays valid until the next Done (a deque keeps its elements in place).
#pragma once

#include <deque>
#include <mutex>

namespace crun {

template <typename Message>
class WriteQueue {
 public:
  // Queues `m`; returns it if the stream is idle (the caller starts that write), else nullptr.
  const Message* Push(Message m) {
    std::lock_guard lock(mu_);
    if (closed_) return nullptr;
    queue_.push_back(std::move(m));
    if (writing_) return nullptr;
    writing_ = true;
    return &queue_.front();
  }
  // The write in flight completed; returns the next one to start, or nullptr (idle now).
  const Message* Done() {
    std::lock_guard lock(mu_);
    if (!queue_.empty()) queue_.pop_front();
    if (queue_.empty() || (closed_ && !drain_)) {
      writing_ = false;
      return nullptr;
    }
    return &queue_.front();
  }
  // No more pushes. With `drain` the queued messages are still written, else they are
  // dropped (the stream failed). Returns true if no write is in flight.
  bool Close(bool drain = false) {
    std::lock_guard lock(mu_);
    closed_ = true;
    drain_ = drain;
    return !writing_;
  }

 private:
  std::mutex mu_;
  std::deque<Message> queue_;
  bool writing_ = false;
  bool closed_ = false;
  bool drain_ = false;
};

}  // namespace crun
