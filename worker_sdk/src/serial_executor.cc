#include "worker_sdk/src/serial_executor.h"

#include <utility>

#include "worker_sdk/src/step_clock.h"

namespace crun::worker {

// What the executor's thread and the waiting callers share. Items point at it weakly, so a
// Work outliving its group waits on its own state only.
struct SerialExecutor::Queue {
  std::mutex mu;
  std::condition_variable cv;  // the executor's thread: work queued, or running_ cleared
  std::deque<std::shared_ptr<Item>> items;
  bool running = false;  // an item is running, on the executor's thread or a caller's
  bool stopping = false;
};

class SerialExecutor::Item final : public Work {
 public:
  Item(std::function<Status()> task, std::weak_ptr<Queue> queue)
      : task_(std::move(task)), queue_(std::move(queue)) {}

  bool Test() override {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }

  Status Wait() override {
    internal::CollectiveWaitTimer timed;
    if (auto q = queue_.lock()) {
      std::unique_lock<std::mutex> l(q->mu);
      if (!q->running && !q->stopping && !q->items.empty() && q->items.front().get() == this) {
        std::shared_ptr<Item> self = std::move(q->items.front());
        q->items.pop_front();
        q->running = true;
        l.unlock();
        Run();
        l.lock();
        q->running = false;
        l.unlock();
        q->cv.notify_all();
      }
    }
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_; });
    return status_;
  }

  void Run() {
    Status s = task_();
    task_ = nullptr;  // its captures may hold memory
    Finish(std::move(s));
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
  std::function<Status()> task_;
  std::weak_ptr<Queue> queue_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

SerialExecutor::SerialExecutor() : queue_(std::make_shared<Queue>()), thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() {
  std::deque<std::shared_ptr<Item>> left;
  {
    std::unique_lock<std::mutex> l(queue_->mu);
    queue_->stopping = true;
    left.swap(queue_->items);
    // An item a caller took runs on that caller's thread: wait for it too.
    queue_->cv.wait(l, [&] { return !queue_->running; });
  }
  queue_->cv.notify_all();
  for (auto& item : left) {
    item->Finish(Aborted(owner_ + ": the group was destroyed before this operation ran"));
  }
  thread_.join();
}

WorkPtr SerialExecutor::Submit(std::function<Status()> task) {
  auto item = std::make_shared<Item>(std::move(task), queue_);
  {
    std::lock_guard<std::mutex> l(queue_->mu);
    queue_->items.push_back(item);
  }
  queue_->cv.notify_all();
  return item;
}

void SerialExecutor::Loop() {
  Queue& q = *queue_;
  for (;;) {
    std::shared_ptr<Item> next;
    {
      std::unique_lock<std::mutex> l(q.mu);
      q.cv.wait(l, [&] { return q.stopping || (!q.running && !q.items.empty()); });
      if (q.stopping) return;
      next = std::move(q.items.front());
      q.items.pop_front();
      q.running = true;
    }
    next->Run();
    {
      std::lock_guard<std::mutex> l(q.mu);
      q.running = false;
    }
    q.cv.notify_all();
  }
}

}  // namespace crun::worker
