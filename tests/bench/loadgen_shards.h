// The rendezvous load generator's processes (rdzv_loadgen.cc, rdzv_loadgen_etcd.cc): the
// coordinator forks shards, each holding a share of the simulated agents, and drives them
// phase by phase over pipes, a line a command and a line a reply.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/bench/loadgen_util.h"

namespace crun::bench {

using LoadClock = std::chrono::steady_clock;

// The steady clock in nanoseconds: the same clock in every process of a run.
std::int64_t NowNs();

// Writes `line` and a newline; quietly stops when the other end is gone (its reader says so).
void WriteLine(int fd, const std::string& line);

// Whole lines from a pipe, each read bounded by a deadline.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  int fd() const { return fd_; }
  // False at end of file or when the deadline passed first.
  bool Read(std::string& line, LoadClock::time_point deadline);

 private:
  int fd_;
  std::string buf_;
};

// A shard's end of its command pipe: the coordinator's commands, a line each.
class Commands {
 public:
  explicit Commands(int fd) : reader_(fd) {}
  // The next command's word, and the rest of its line in `args`; false when the coordinator
  // is gone (its end closed, or no command for an hour: it bounds every phase itself).
  bool Next(std::string& word, std::istringstream& args);

 private:
  LineReader reader_;
};

// A shard's body: its index, the pipe it reads commands from and the one it replies on; its
// return value is its exit status.
using ShardMain = std::function<int(int shard, int cmd_fd, int reply_fd)>;

// The coordinator's end of the shards.
class Shards {
 public:
  ~Shards() { Stop(); }

  // Forks `procs` shards, each running `body` (fork before any gRPC object exists in this
  // process); false, with why on stderr, when one could not start.
  bool Start(int procs, const ShardMain& body);

  std::size_t size() const { return shards_.size(); }
  std::vector<int> pids() const;

  void Send(std::size_t s, const std::string& line);
  void SendAll(const std::string& line);

  // Shard s's next reply, which must begin with `word`: its numbers in `fields`, or with
  // `rest` the remainder of the line as it came.
  bool Expect(std::size_t s, const std::string& word, std::vector<std::int64_t>& fields,
              LoadClock::time_point deadline, std::string* rest = nullptr);

  // Ends every shard: a wait for those that said they are done, SIGKILL for the others.
  void Stop();

 private:
  struct Shard {
    pid_t pid;
    int cmd;
    LineReader reply;
  };
  std::vector<Shard> shards_;
};

// A shard's replies to "await" once the failure went out: "told REACHED T_NS" when every agent
// was told to stop (or the limit), then "reformed REACHED T_NS WRONG" when each holds the next
// round, WRONG counting those in another (the first named on stderr). `round_now(a)` and
// `first_round(a)` read an agent's rounds.
template <typename Agents, typename RoundNow, typename FirstRound>
void ReplyRestarted(int reply_fd, Tally& told, Tally& assigned, std::chrono::milliseconds limit,
                    const Agents& agents, RoundNow round_now, FirstRound first_round) {
  const int t_reached = told.Wait(limit);
  WriteLine(reply_fd, "told " + std::to_string(t_reached) + " " + std::to_string(NowNs()));
  const int a_reached = assigned.Wait(limit);
  const std::int64_t t = NowNs();
  int wrong = 0;
  for (const auto& a : agents) {
    if (round_now(*a) != first_round(*a) + 1 && wrong++ == 0) {
      std::fprintf(stderr, "rdzv_loadgen: agent %d is in round %d after the restart\n", a->index,
                   round_now(*a));
    }
  }
  WriteLine(reply_fd, "reformed " + std::to_string(a_reached) + " " + std::to_string(t) + " " +
                          std::to_string(wrong));
}

}  // namespace crun::bench
