// The hang section of a failure report (docs/hangs.md): who was silent for how long, and
// every rank's stacks, read before anything was stopped. Pure formatting.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/hangs/stack_model.h"

namespace crun::agent {

// A hang, as the report shows it (docs/hangs.md): how long each watched rank had been silent,
// and every rank's stacks, read before anything was stopped.
struct HangReport {
  struct Rank {
    std::string host;
    int rank = 0;
    int local_rank = 0;
    pid_t pid = 0;
    bool hung = false;
    double silent_s = 0;
    char state = '?';
    std::string cause;  // for hung ranks
  };
  std::vector<Rank> ranks;
  std::vector<RankStacks> stacks;
  std::string stacks_dir;          // where each rank's stacks were written, if they were
  std::vector<std::string> notes;  // e.g. the NCCL flight recorder dumps asked for
  // Timing: how late after the deadline the hang was declared (the watch's tick), how long
  // reading every rank's stacks took, and deadline -> this report complete.
  double declared_late_ms = 0, stacks_ms = 0, report_ms = 0;
};

// The Hang section alone: who was silent for how long, the grouped summary of where every
// rank was, then full stacks (every rank's up to 8 ranks; beyond, one rank per group, the
// others in stacks_dir).
std::string FormatHang(const HangReport& hang);
nlohmann::json HangJson(const HangReport& hang);

}  // namespace crun::agent
