// What the launch says of snapshots on disk (docs/checkpoints.md, "On disk"); plain values,
// for AgentOptions and the disk writer alike.
#pragma once

#include <cstdint>
#include <string>

namespace crun::agent {

struct SnapshotDiskOptions {
  std::string dir;            // --checkpoint-dir; empty: nothing goes to disk
  std::uint64_t every = 100;  // --checkpoint-every: in steps
  int keep = 2;               // --checkpoint-keep: the newest steps kept per rank
  bool resume = true;         // --resume-from-disk: offer disk steps to a load
};

}  // namespace crun::agent
