// A pipe's pause and read handlers that complete after their owner (LinePump, WorkerPipe) is
// destroyed must do nothing (pipe_pause.h). After each read the owner releases its pipe from
// epoll and arms a 1 ms timer to watch it again. If the owner is destroyed in the turn of the
// event loop that has already collected that timer's expiry, the timer's handler is queued,
// and destroying the timer does not take it back. The same goes for the read that the handler
// starts when data is waiting: that read completes at once and its handler is queued. Until
// 5914269 both handlers ran on the destroyed owner. That commit's crash showed up once in 12
// runs under ASan, so these cases force the order every time instead of hoping for it.
//
// How the order is forced: the test drives the loop one handler at a time and arms a timer of
// its own whose handler destroys the owner. That timer's deadline is just before the owner's
// pause deadline (or just after it), and the test waits until the clock has passed both
// before it runs the loop again. Asio's epoll reactor then takes every expired timer out of
// its queue in one pass, earliest first (timer_queue::get_ready_timers), and queues their
// handlers behind those already queued, so the handler that destroys the owner and the
// owner's own handler are queued next to each other in a known order.
//
// Without the fix the stale handler ran on the destroyed owner. That is undefined behaviour,
// but the test makes the effect visible in an ordinary build as well as under ASan. The
// owner's memory is kept, destroyed but not freed, until the io_context is gone, so the stale
// handler reads the bytes the destructor left and writes where nothing else lives. Each case
// then checks something such a handler cannot help touching: a pipe that the test puts under
// the owner's old fd number, the owner's callbacks, or work left on the loop. The cases run
// exactly as many handlers as the fixed code queues and then stop, so a stale handler's own
// follow-up work is never run.
#include "agent/hangs/worker_pipe.h"
#include "agent/output/line_pump.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

namespace {

namespace asio = boost::asio;
using crun::agent::LinePump;
using crun::agent::PumpTargets;
using crun::agent::WorkerPipe;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Keeps the memory of owners destroyed during a test until the test ends. It is declared
// before the io_context, so it outlives it. A stale handler (the bug) then writes only into
// memory that nothing else uses. The io_context's shutdown still walks a timer that such a
// handler armed inside the destroyed owner, and that memory is still there for it.
class Graveyard {
 public:
  Graveyard() = default;
  Graveyard(const Graveyard&) = delete;
  Graveyard& operator=(const Graveyard&) = delete;
  ~Graveyard() {
    for (void* grave : graves_) ::operator delete(grave);
  }
  // Runs the owner's destructor, as `delete` would, but keeps its memory.
  template <typename T>
  void Bury(std::unique_ptr<T>& owner) {
    graves_.push_back(owner.get());
    owner.release()->~T();
  }

 private:
  std::vector<void*> graves_;
};

// The number of bytes waiting in the pipe whose read end is `fd`.
int Unread(int fd) {
  int n = -1;
  ::ioctl(fd, FIONREAD, &n);
  return n;
}

bool NonBlocking(int fd) { return (::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }

bool Closed(int fd) { return ::fcntl(fd, F_GETFD) == -1 && errno == EBADF; }

void Put(int fd, std::string_view bytes) {
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
}

// A LinePump on a pipe of the test's, standing in for a worker's stdout. The pump counts its
// reads in the progress counter that hang detection uses, and the test holds the same counter,
// so the count survives the pump. The pump has no targets, keeps no tail lines, and never gets
// a newline. So without the fix, a stale handler stops at the destroyed pump's strings (whose
// short contents live inside the pump's own memory) and never reaches its deque, whose memory
// is freed: the case fails a check instead of crashing.
struct PumpCase {
  int read_fd = -1;  // the pump's
  int write_fd = -1;
  std::shared_ptr<std::uint64_t> progress = std::make_shared<std::uint64_t>(0);
  bool eof = false;
  std::unique_ptr<LinePump> owner;

  explicit PumpCase(asio::io_context& io) {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    read_fd = p[0];
    write_fd = p[1];
    PumpTargets t;
    t.tail_lines = 0;
    t.progress = progress;
    owner = std::make_unique<LinePump>(io, read_fd, std::move(t), [this] { eof = true; });
  }
  ~PumpCase() { ::close(write_fd); }
  PumpCase(const PumpCase&) = delete;
  PumpCase& operator=(const PumpCase&) = delete;

  std::uint64_t reads() const { return *progress; }
  bool ended() const { return eof; }
};

// A WorkerPipe, standing in for a worker's heartbeat pipe. The pipe owns both ends; its
// on_data counts the reads.
struct WorkerPipeCase {
  int read_fd = -1;
  int write_fd = -1;  // the worker's end
  std::uint64_t data_calls = 0;
  std::unique_ptr<WorkerPipe> owner;

  explicit WorkerPipeCase(asio::io_context& io) {
    auto created = WorkerPipe::Create(io, [this](std::string_view) { ++data_calls; });
    REQUIRE(created.ok());
    owner = std::move(created).value();
    read_fd = owner->read_fd();
    write_fd = owner->child_fd();
  }
  WorkerPipeCase(const WorkerPipeCase&) = delete;
  WorkerPipeCase& operator=(const WorkerPipeCase&) = delete;

  std::uint64_t reads() const { return data_calls; }
  bool ended() const { return false; }  // a WorkerPipe has no end callback
};

// Times measured just before and just after the one handler in which the owner read "x" and
// paused. The owner's pause deadline (its now() + 1 ms) lies in [before + 1 ms, after + 1 ms].
struct PauseArmed {
  Clock::time_point before, after;
};

// Runs the loop one handler at a time until the owner has handled its first read. That
// handler ends by pausing: the pipe leaves epoll and the owner's 1 ms timer is armed. Nothing
// else is left queued, and the loop does not run again until the test says so.
template <typename Case>
PauseArmed ReadOnceAndPause(asio::io_context& io, Case& c) {
  Put(c.write_fd, "x");
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  PauseArmed armed;
  do {
    armed.before = Clock::now();
    io.run_one_for(milliseconds(50));  // runs one handler at most
    armed.after = Clock::now();
  } while (c.reads() == 0 && armed.after < give_up);
  REQUIRE(c.reads() == 1);
  return armed;
}

// The owner is destroyed by a handler queued just ahead of its pause handler. The pause
// handler must not watch the pipe again.
//
// Without the fix it did. It assigned the fd number it had captured to the destroyed owner's
// stream_descriptor, which succeeds because the number is open again (below), and then called
// Read() on the destroyed owner. Asio then makes the descriptor non-blocking and reads it at
// once, and the read's handler stays queued as work on the loop. The destroyed owner had
// closed that fd, and the test puts a blocking pipe of its own under the number, holding one
// byte. So the stale handler shows as that pipe turned non-blocking, its byte taken, and the
// loop not stopped. Had the number stayed closed, the stale handler would have called `lost`
// instead, which calls the destroyed pump's on_eof: a call on a destroyed std::function, too
// fragile to rely on.
template <typename Case>
void PauseHandlerQueuedBehindDestruction() {
  Graveyard graves;
  asio::io_context io;
  Case c(io);
  const PauseArmed armed = ReadOnceAndPause(io, c);
  // Data that gathers while the pipe is unwatched: a pause handler that watches the pipe again
  // takes it at once.
  Put(c.write_fd, "y");
  int probe[2];  // blocking, holding one byte
  REQUIRE(::pipe2(probe, O_CLOEXEC) == 0);
  Put(probe[1], "p");
  const int fd = c.read_fd;

  // `before` is at least 1 ms ahead of the owner's pause deadline, so this handler is queued
  // first.
  bool destroyed = false;
  asio::steady_timer destroyer(io);
  destroyer.expires_at(armed.before);
  destroyer.async_wait([&](const boost::system::error_code& ec) {
    CHECK_FALSE(ec);
    CHECK(Unread(fd) == 1);  // the pause handler has not run yet, or "y" would be read
    graves.Bury(c.owner);
    destroyed = true;
    CHECK(Closed(fd));  // a paused owner closes the fd it released
    CHECK(::dup2(probe[0], fd) == fd);
  });
  // The loop does not look until both deadlines have passed, so it collects both timers in
  // one pass.
  std::this_thread::sleep_until(armed.after + milliseconds(8));
  REQUIRE(io.poll_one() == 1);  // the test's handler
  REQUIRE(destroyed);
  REQUIRE(io.poll_one() == 1);  // the owner's pause handler, queued in the same pass
  CHECK_FALSE(NonBlocking(fd));
  CHECK(Unread(fd) == 1);
  CHECK(c.reads() == 1);
  CHECK_FALSE(c.ended());
  CHECK(io.stopped());  // no read was started, so no work is left
  ::close(fd);
  ::close(probe[0]);
  ::close(probe[1]);
}

// The owner is destroyed by a handler queued just behind its pause handler. The pause handler
// watches the pipe again and reads the waiting "y" at once, which queues the read's handler
// behind the destroying one. That read handler must do nothing.
//
// Without the fix it handled the read on the destroyed owner. LinePump bumped the progress
// counter that the test shares. WorkerPipe called on_data through the destroyed
// std::function, whose target libstdc++'s destructor leaves in place, so the test's count went
// up. Either owner then paused again and armed its destroyed timer, so the loop had work left.
template <typename Case>
void ReadHandlerQueuedBehindDestruction() {
  Graveyard graves;
  asio::io_context io;
  Case c(io);
  const PauseArmed armed = ReadOnceAndPause(io, c);
  Put(c.write_fd, "y");
  const int fd = c.read_fd;

  // `after + 2 ms` is at least 1 ms after the owner's pause deadline, so this handler is
  // queued second, and it has passed by the time the loop looks.
  bool destroyed = false;
  asio::steady_timer destroyer(io);
  destroyer.expires_at(armed.after + milliseconds(2));
  destroyer.async_wait([&](const boost::system::error_code& ec) {
    CHECK_FALSE(ec);
    CHECK(Unread(fd) == 0);  // the pause handler has run and has read "y" ...
    CHECK(c.reads() == 1);   // ... and that read's handler is still queued
    graves.Bury(c.owner);
    destroyed = true;
  });
  std::this_thread::sleep_until(armed.after + milliseconds(8));
  REQUIRE(io.poll_one() == 1);  // the owner's pause handler: watches again, reads "y"
  REQUIRE(io.poll_one() == 1);  // the test's handler
  REQUIRE(destroyed);
  REQUIRE(io.poll_one() == 1);  // the read's handler, queued before the owner was destroyed
  CHECK(c.reads() == 1);
  CHECK_FALSE(c.ended());
  CHECK(io.stopped());  // no pause was armed, so no work is left
}

}  // namespace

TEST_CASE("a line pump's pause handler, queued when the pump is destroyed, does nothing") {
  PauseHandlerQueuedBehindDestruction<PumpCase>();
}

TEST_CASE("a line pump's read handler, queued when the pump is destroyed, does nothing") {
  ReadHandlerQueuedBehindDestruction<PumpCase>();
}

TEST_CASE("a worker pipe's pause handler, queued when the pipe is destroyed, does nothing") {
  PauseHandlerQueuedBehindDestruction<WorkerPipeCase>();
}

TEST_CASE("a worker pipe's read handler, queued when the pipe is destroyed, does nothing") {
  ReadHandlerQueuedBehindDestruction<WorkerPipeCase>();
}
