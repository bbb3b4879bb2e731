// The pause after each read of a worker's pipe, shared by the output pump (line_pump.h) and the
// heartbeat and stack pipes (hangs/worker_pipe.h): a worker printing in a tight loop would
// otherwise wake crun's event loop once per write. The pipe leaves the loop's epoll set for a
// millisecond, so its writes wake nobody and the next read takes what gathered meanwhile.
#pragma once

#include <chrono>
#include <memory>
#include <utility>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

namespace crun::agent {

// Releases `fd` from `pipe` and, after the pause, watches it again and calls `resume` (the next
// read), or calls `lost` when it cannot be watched again (the caller closes `fd`). Nothing is
// called once `timer` is cancelled, or once `owner` (a token whose life is that of whoever
// holds `pipe` and `timer`) has expired: a wait that had completed when its owner was destroyed
// in the same turn of the loop is not cancelled by the timer's destruction, and its handler
// still runs.
template <typename Resume, typename Lost>
void PausePipe(boost::asio::posix::stream_descriptor& pipe, int fd,
               boost::asio::steady_timer& timer, std::weak_ptr<const void> owner, Resume resume,
               Lost lost) {
  pipe.release();  // out of the event loop's epoll set: writes wake nobody
  timer.expires_after(std::chrono::milliseconds(1));
  timer.async_wait([&pipe, fd, owner = std::move(owner), resume = std::move(resume),
                    lost = std::move(lost)](const boost::system::error_code& ec) mutable {
    if (ec || owner.expired()) return;
    boost::system::error_code e;
    pipe.assign(fd, e);
    if (e) return lost();
    resume();
  });
}

}  // namespace crun::agent
