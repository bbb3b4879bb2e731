// Runs a group's operations one at a time, in the order they were submitted: the asynchronous
// form of a backend whose library calls block (Gloo). A thread of the group's own runs them,
// except that a caller waiting on the next operation while nothing else runs takes it and runs
// it itself: a blocking collective then costs no hand-off between threads (two wake-ups,
// which on a busy or virtualised host cost more than a small collective).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "crun/worker/process_group.h"

namespace crun::worker {

class SerialExecutor {
 public:
  SerialExecutor();
  // Fails what is still queued (kAborted, naming the group as `owner`) and waits for the
  // operation in flight, whose buffers may still be in use.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // `owner` names the group in the message of work failed by the destructor.
  void set_owner(std::string owner) { owner_ = std::move(owner); }

  WorkPtr Submit(std::function<Status()> task);

  class Item;
  struct Queue;

 private:
  void Loop();

  std::shared_ptr<Queue> queue_;
  std::string owner_ = "process group";
  std::thread thread_;
};

}  // namespace crun::worker
