// SmallFifo: first in, first out against std::deque under random pushes and pops; no heap while
// unused; bounded slots for a queue that never empties; a popped element released at once.
// WriteQueue, built on it: one write in flight at a time, in order, drained or dropped on close.
#include <catch2/catch.hpp>

#include <algorithm>
#include <deque>
#include <memory>
#include <random>
#include <string>

#include "base/small_fifo.h"
#include "base/write_queue.h"

TEST_CASE("small fifo keeps the order of std::deque under random pushes and pops", "[small_fifo]") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    crun::SmallFifo<std::string> fifo;
    std::deque<std::string> model;
    std::size_t longest = 0;
    for (int step = 0; step < 2'000; ++step) {
      INFO("seed " << seed << ", step " << step);
      // Pushes slightly more likely than pops, with bursts of each.
      const int burst = static_cast<int>(rng() % 5) + 1;
      const bool push = rng() % 100 < 52 || model.empty();
      for (int i = 0; i < burst; ++i) {
        if (push) {
          std::string v = "message " + std::to_string(step) + "." + std::to_string(i);
          fifo.push_back(v);
          model.push_back(v);
        } else if (!model.empty()) {
          REQUIRE(fifo.front() == model.front());
          if (rng() % 2) {
            CHECK(fifo.take_front() == model.front());
          } else {
            fifo.pop_front();
          }
          model.pop_front();
        }
        REQUIRE(fifo.size() == model.size());
        REQUIRE(fifo.empty() == model.empty());
        longest = std::max(longest, model.size());
      }
      // The vector holds at most twice the longest queue, and grows by doubling.
      REQUIRE(fifo.capacity() <= 4 * (longest + 1));
    }
  }
}

TEST_CASE("small fifo holds no heap until used and gives its slots back", "[small_fifo]") {
  crun::SmallFifo<std::string> fifo;
  CHECK(fifo.capacity() == 0);
  CHECK(fifo.empty());
  fifo.push_back("a");
  fifo.push_back("b");
  CHECK(fifo.capacity() >= 2);
  fifo.pop_front();
  fifo.pop_front();
  CHECK(fifo.empty());
  fifo.push_back("c");  // the emptied slots are used again from the start
  CHECK(fifo.front() == "c");
  fifo.release();
  CHECK(fifo.capacity() == 0);
  CHECK(fifo.empty());
}

TEST_CASE("small fifo that never empties stays within twice its length", "[small_fifo]") {
  crun::SmallFifo<int> fifo;
  for (int i = 0; i < 4; ++i) fifo.push_back(i);
  for (int i = 4; i < 100'000; ++i) {
    fifo.push_back(i);
    REQUIRE(fifo.front() == i - 4);
    fifo.pop_front();
    REQUIRE(fifo.size() == 4);
  }
  CHECK(fifo.capacity() <= 16);
}

TEST_CASE("small fifo releases a popped element at once", "[small_fifo]") {
  crun::SmallFifo<std::shared_ptr<int>> fifo;
  auto first = std::make_shared<int>(1);
  std::weak_ptr<int> watch = first;
  fifo.push_back(std::move(first));
  fifo.push_back(std::make_shared<int>(2));
  fifo.push_back(std::make_shared<int>(3));
  fifo.pop_front();
  CHECK(watch.expired());  // not kept in a spent slot until the queue empties
  CHECK(*fifo.front() == 2);
}

TEST_CASE("write queue hands out one write at a time, in order, and drains on close",
          "[write_queue]") {
  crun::WriteQueue<std::string> q;
  const std::string* first = q.Push("a");
  REQUIRE(first != nullptr);  // idle: the caller starts it
  CHECK(*first == "a");
  CHECK(q.Push("b") == nullptr);  // one in flight: queued
  CHECK(q.Push("c") == nullptr);
  CHECK(*first == "a");  // the one in flight stays in place while others queue
  const std::string* next = q.Done();
  REQUIRE(next != nullptr);
  CHECK(*next == "b");
  CHECK_FALSE(q.Close(/*drain=*/true));  // "b" still in flight
  CHECK(q.Push("d") == nullptr);         // closed: dropped
  next = q.Done();
  REQUIRE(next != nullptr);
  CHECK(*next == "c");  // drained
  CHECK(q.Done() == nullptr);
  CHECK(q.Close());
}

TEST_CASE("write queue closed without drain drops what waits", "[write_queue]") {
  crun::WriteQueue<std::string> q;
  REQUIRE(q.Push("a") != nullptr);
  CHECK(q.Push("b") == nullptr);
  CHECK_FALSE(q.Close());
  CHECK(q.Done() == nullptr);  // "b" dropped: the stream failed
  CHECK(q.Close());
  CHECK(q.Push("c") == nullptr);
}
