// The service's end of heartbeats over UDP (rendezvous/beats/beat_datagram.h): a socket on the
// gRPC server's address and port, read in batches on a thread of its own. While any session
// holds a ticket, the socket is drained (recvmmsg, 64 datagrams a call) every `gap` (the
// heartbeats' batching, as on the stream): one wake-up per gap however many agents beat, none
// while no session is open. The socket is not in an event loop's epoll set: there, each
// datagram would wake the thread (edge-triggered readiness), once a beat.
//
// Each session's key is held here from its opening to its end (Add/Remove, any thread). A
// datagram is taken when its tag is its session's key's and its beat's sequence is above the
// last one taken: forged, replayed, truncated and unknown-session datagrams are counted and
// dropped. Each beat taken is acked at once to the address it came from (sendmmsg, a batch a
// call), and the drain's beats are handed to the engine's thread in one post. The acks come
// from this thread, not the engine's: an engine busy forming a round of 100,000 does not
// leave beats unanswered, which would send every agent's next beat to its stream too.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "base/socket.h"
#include "base/status.h"
#include "crun/v1/rendezvous.pb.h"
#include "rendezvous/beats/beat_datagram.h"

namespace crun::rdzv {

class BeatReceiver {
 public:
  // What happened to the datagrams read (crun_rendezvous_beat_datagrams_total's "result").
  struct Counts {
    std::atomic<std::uint64_t> taken{0}, forged{0}, stale{0}, unknown{0}, malformed{0};
    std::atomic<std::uint64_t> acks_unsent{0};  // the socket's send buffer was full
    std::atomic<std::uint64_t> dropped{0};      // by the kernel, never read: the buffer was full
  };
  // `beat`: a datagram taken, on the engine's thread (`engine`). `before` and `after` each
  // drain's taken beats (the service hands the engine its queued stream messages first, and
  // rearms the engine's timer after).
  using BeatHandler = std::function<void(std::uint64_t session, const v1::Heartbeat& beat)>;

  // Binds UDP on host:port, every address it resolves to; an error names them (the port taken
  // by another program's UDP).
  ~BeatReceiver();
  BeatReceiver(const BeatReceiver&) = delete;
  BeatReceiver& operator=(const BeatReceiver&) = delete;
  static StatusOr<std::unique_ptr<BeatReceiver>> Open(boost::asio::io_context& engine,
                                                      const std::string& host, std::uint16_t port,
                                                      std::chrono::milliseconds gap);
  void Start(BeatHandler beat, std::function<void()> before, std::function<void()> after);
  // Any thread but the receiver's: no handler is posted to the engine after it returns.
  void Stop();

  std::uint16_t port() const { return port_; }
  // A new session's key (any thread): its ticket carries it.
  BeatKey Add(std::uint64_t session);
  void Remove(std::uint64_t session);
  const Counts& counts() const { return counts_; }

 private:
  BeatReceiver(boost::asio::io_context& engine, std::chrono::milliseconds gap);
  // The receiver's thread: drains now and again after each gap while sessions hold tickets.
  void Poll();
  struct Batch;  // one recvmmsg's room and its acks
  struct Taken;  // a beat taken, for the engine
  // fds_[index]'s datagrams, acked on it: each batch received, taken, its acks sent.
  void Drain(std::size_t index);
  // The batch's first `n` datagrams checked (session, seal, sequence) under mu_, the good ones
  // into `taken` with their acks queued in `b`; how many acks.
  std::size_t Take(Batch& b, std::size_t n, std::vector<Taken>& taken);
  void SendAcks(int fd, Batch& b, std::size_t acked);
  // The kernel's drop count on a datagram read from fds_[index] (SO_RXQ_OVFL).
  void NoteDrops(std::size_t index, const msghdr& h);

  boost::asio::io_context& engine_;
  boost::asio::io_context io_;  // the receiver's thread's
  std::thread thread_;
  std::vector<UniqueFd> fds_;                // one an address the host resolves to
  std::vector<std::uint32_t> dropped_seen_;  // each socket's drop count, last read
  boost::asio::steady_timer gap_timer_;
  std::chrono::milliseconds gap_;
  std::uint16_t port_ = 0;
  BeatHandler beat_;
  std::function<void()> before_, after_;
  struct Entry {
    BeatKey key;
    std::uint64_t last_sequence = 0;
  };
  std::mutex mu_;
  std::unordered_map<std::uint64_t, Entry> sessions_;
  Counts counts_;
  bool polling_ = false;  // under mu_: a Poll is scheduled
  bool started_ = false;  // under mu_
  bool stopped_ = false;  // under mu_
};

}  // namespace crun::rdzv
