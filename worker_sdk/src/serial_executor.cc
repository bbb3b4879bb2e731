#include "worker_sdk/src/serial_executor.h"

#include <utility>

namespace crun::worker {

class SerialExecutor::Item final : public Work {
 public:
  bool Test() override {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }
  Status Wait() override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_; });
    return status_;
  }
  void Finish(Status s) {
    {
      std::lock_guard<std::mutex> l(mu_);
      status_ = std::move(s);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

SerialExecutor::SerialExecutor() : thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() {
  std::deque<std::pair<std::function<Status()>, std::shared_ptr<Item>>> left;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    left.swap(queue_);
  }
  cv_.notify_all();
  for (auto& [task, item] : left) {
    item->Finish(Aborted(owner_ + ": the group was destroyed before this operation ran"));
  }
  thread_.join();
}

WorkPtr SerialExecutor::Submit(std::function<Status()> task) {
  auto item = std::make_shared<Item>();
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.emplace_back(std::move(task), item);
  }
  cv_.notify_one();
  return item;
}

void SerialExecutor::Loop() {
  for (;;) {
    std::pair<std::function<Status()>, std::shared_ptr<Item>> next;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    next.second->Finish(next.first());
  }
}

}  // namespace crun::worker
