// SmallFifo: a first-in first-out queue that holds nothing on the heap while it has never been
// used, and only its elements' slots once it has. It is for the many idle queues of one process
// (a write queue for each of 100,000 sessions): libstdc++'s std::deque allocates its map and a
// 512-byte block when it is constructed, about 600 bytes for a queue that stays empty.
//
// A vector and the index of its front: pop_front resets the slot (its resources go at once) and
// moves the index; the vector is cleared once the index reaches its end, and the spent front is
// erased once it is more than half of the vector, so that a queue that never empties stays
// within twice its longest length. Elements move when the vector grows or is compacted:
// references to them are valid until the next push_back or pop_front.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace crun {

template <typename T>
class SmallFifo {
 public:
  bool empty() const { return head_ == items_.size(); }
  std::size_t size() const { return items_.size() - head_; }
  // Slots held (the heap this queue uses is capacity() elements).
  std::size_t capacity() const { return items_.capacity(); }

  T& front() { return items_[head_]; }
  const T& front() const { return items_[head_]; }

  void push_back(T v) { items_.push_back(std::move(v)); }

  // Removes the front and returns it. The queue must not be empty.
  T take_front() {
    T v = std::move(items_[head_]);
    pop_front();
    return v;
  }

  void pop_front() {
    items_[head_] = T();
    ++head_;
    if (head_ == items_.size()) {
      items_.clear();
      head_ = 0;
    } else if (head_ * 2 > items_.size()) {
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }

  void clear() {
    items_.clear();
    head_ = 0;
  }

  // Gives the heap back (clear() keeps the slots for the next burst).
  void release() {
    std::vector<T>().swap(items_);
    head_ = 0;
  }

 private:
  std::vector<T> items_;
  std::size_t head_ = 0;
};

}  // namespace crun
