// What is said of stacks: where each rank waits, ranks grouped by that place, the ranks that
// look like a hang's cause, and one rank's stacks as text and as JSON. Pure functions.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/hangs/stack_model.h"

namespace crun::agent {

// Where the main thread is: "in `hang_here` <- `main` <- `<module>`", from its innermost
// frames, skipping the C library's wait primitives; ranks with the same place are one group.
std::string WhereWaiting(const RankStacks& stacks);
// "0-4,6-7"
std::string RankRanges(std::vector<int> ranks);
// One line per group: groups holding a rank of `first` (the hung ones) first, then the smallest
// group (the odd one out):
//   "rank 5: in `load_batch` <- `train_step`"
//   "ranks 0-4,6-7: in `all_reduce` <- `wrapper` <- `train_step`"
std::vector<std::string> GroupSummary(const std::vector<RankStacks>& ranks,
                                      const std::set<int>& first = {});
// The grouped summary, then full stacks: every rank's up to 8 ranks; beyond, those of the
// ranks in `always` and of the first rank of each group, the rest named as "the same places".
std::string FormatStacks(const std::vector<RankStacks>& ranks, const std::set<int>& always);
// Which ranks look like the cause of a hang, from where they are: those whose main thread is
// not in a collective (all_reduce, barrier, ... in torch.distributed, Gloo or NCCL) while others
// are; else the one smallest group, when one group is smaller than all others; else every
// rank. Ranks whose stacks could not be read are never suspects on their stacks alone.
std::set<int> SuspectRanks(const std::vector<RankStacks>& ranks);
// One rank's full stacks, as text: its header line, then each thread.
std::string FormatRankStacks(const RankStacks& stacks);
nlohmann::json StacksJson(const RankStacks& stacks);
RankStacks StacksFromJson(const nlohmann::json& j);

}  // namespace crun::agent
