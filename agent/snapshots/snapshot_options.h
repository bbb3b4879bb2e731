// What the launch says of snapshots on disk (docs/checkpoints.md, "On disk") and of copies to
// peers; plain values, for AgentOptions and the snapshot store alike.
#pragma once

#include <cstdint>
#include <string>

namespace crun::agent {

struct SnapshotDiskOptions {
  std::string dir;            // --checkpoint-dir; empty: nothing goes to disk
  std::uint64_t every = 100;  // --checkpoint-every: in steps
  int keep = 2;               // --checkpoint-keep: the newest steps kept per rank
  bool resume = true;         // --resume-from-disk: offer disk steps to a load
  // Which job writes there, so that two jobs never write one directory at once: for a job of
  // several cruns, its rendezvous endpoint and run id, the same on each of them; empty for a
  // crun that runs the whole job alone.
  std::string job;
};

// What the node's store holds now, for the rendezvous' heartbeats (`crun status`): written by
// the snapshot store on the agent's loop, read there by the rendezvous. -1: none.
struct SnapshotFacts {
  std::uint64_t bytes = 0;
  std::int64_t step = -1;       // the newest step every local rank holds in memory
  std::int64_t disk_step = -1;  // the newest step written to --checkpoint-dir
};

}  // namespace crun::agent
