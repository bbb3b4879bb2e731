// Runs a group's operations one at a time, in the order they were submitted, on a thread of
// the group's own: the asynchronous form of a backend whose library calls block (Gloo). The
// caller's thread only queues work and waits on it.
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

 private:
  class Item;
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<Status()>, std::shared_ptr<Item>>> queue_;
  bool stopping_ = false;
  std::string owner_ = "process group";
  std::thread thread_;
};

}  // namespace crun::worker
