// How workers reach the node's snapshot memory (node_snapshots.h): a Unix socket in the
// abstract namespace, "crun/<pid>/snapshots" (nothing on disk, gone with crun), named to each
// worker in CRUN_SNAPSHOT_SOCKET. Only crun's user (or root) is answered (SO_PEERCRED).
//
// A worker keeps one connection and sends one request per line; crun answers those that need
// an answer with one line, and hands buffers over as descriptors (SCM_RIGHTS) with it:
//   reserve L I BYTES   buffer I of local rank L with room for BYTES of payload
//                       -> "ok CAPACITY" and its descriptor, or "error WHY"
//   saved L I           buffer I holds a new complete snapshot: crun seals it (no answer)
//   commit L I          the same, answered "ok" once crun has sealed it and copied it to the
//                       next node (replicas.h): a save in a job of several nodes returns only
//                       then, so that the job always has a step that every rank holds
//   load L              crun checks the newest complete buffer against its checksum
//                       -> "ok V0 C0 V1 C1" (verdict and capacity of each: none, incomplete,
//                          valid, sealed (complete, not checked yet) or corrupt) and the
//                          descriptors of those that exist, in order
//   verify L I          buffer I checked against its checksum -> "ok VERDICT" (a load that
//                       takes the older, sealed buffer asks first)
//   open L              the same answer as load's, unchecked ("-" for each verdict): a save's
//                       first look
//   settle L I          -> "ok" once crun is done with buffer I's complete snapshot (sealed,
//                       and copied for disk when chosen): a save asks before it overwrites a
//                       buffer that carries no seal yet, so crun never loses a step to a
//                       worker that saves faster than crun seals or the disk takes copies
//   disk L R W          the steps beyond memory that rank R of a world of W may load, newest
//                       first -> "ok S1,S2,..." ("ok": none): on disk (--checkpoint-dir), and
//                       on the round's other nodes (replicas.h) when this node holds nothing
//                       of rank R
//   restore L R S       rank R's step S from a peer's copy or else from disk into local rank
//                       L's memory, checked -> "ok INDEX CAPACITY" and the buffer's
//                       descriptor, or "error WHY"
// Checksums are computed off the agent's loop, on a thread per local rank (a node's ranks in
// parallel, one rank's buffers in order); a seal already waiting for a buffer is not queued
// twice. With a disk (disk_snapshots.h), the seal of a step chosen for it copies the buffer
// out, and one writer thread for the node puts the copies on disk.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include "agent/snapshots/disk_snapshots.h"
#include "agent/snapshots/node_snapshots.h"
#include "agent/snapshots/replicas.h"
#include "base/status.h"

namespace crun::agent {

// "@crun/<pid>/snapshots": the abstract name with '@' for its leading NUL, as workers get it.
std::string SnapshotSocketName(pid_t pid);

// What the server has seen, for the metrics and the log.
struct SnapshotCounters {
  std::uint64_t saves = 0, loads = 0, refusals = 0, corrupt = 0;
};

// Runs jobs in order on a thread of its own.
class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();
  void Post(std::function<void()> job);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

class SnapshotServer {
 public:
  static StatusOr<std::unique_ptr<SnapshotServer>> Listen(boost::asio::io_context& io,
                                                          NodeSnapshots& memory,
                                                          DiskSnapshots* disk = nullptr,
                                                          Replicas* replicas = nullptr);
  ~SnapshotServer();
  const SnapshotCounters& counters() const { return counters_; }
  // The agent's loop hears each answered request (metrics); may be empty.
  void OnChange(std::function<void()> f) { on_change_ = std::move(f); }

 private:
  class Session;
  SnapshotServer(boost::asio::io_context& io, NodeSnapshots& memory, DiskSnapshots* disk,
                 Replicas* replicas);
  void Accept();

  boost::asio::io_context& io_;
  NodeSnapshots& memory_;
  DiskSnapshots* disk_;  // null: nothing goes to disk
  Replicas* replicas_;   // null: nothing goes to a peer
  std::atomic<bool> told_replica_{false};
  bool told_resume_ = false;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  SnapshotCounters counters_;
  std::function<void()> on_change_;
  std::shared_ptr<bool> alive_;
  // The local rank's thread for checksums; queues a seal of buffer `index` unless one waits.
  SerialWorker& SealerOf(int local_rank);
  // `done`, when given, runs on the loop once the seal (and the copy to the next node) is done.
  void QueueSeal(int local_rank, int index, std::function<void()> done = {});
  void Replicate(int local_rank, int index);
  void Persist(int local_rank, int index);
  void Written(int local_rank);
  void SkipDiskStep(int local_rank, int index, const char* why);
  static constexpr int kQueuedCopies = 2;
  static constexpr std::chrono::seconds kWriterWait{30};

  std::mutex pending_mu_;
  std::set<std::pair<int, int>> pending_seals_;
  std::condition_variable writes_cv_;
  std::map<int, int> outstanding_writes_;  // per local rank: copies not written yet
  std::atomic<bool> told_skip_{false};
  std::unique_ptr<SerialWorker> writer_;
  // Last: stopped (joined) first, while the rest still stands (the writer after them).
  std::map<int, std::unique_ptr<SerialWorker>> sealers_;
};

}  // namespace crun::agent
