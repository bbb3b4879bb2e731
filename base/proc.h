// What the kernel says of a process in /proc: one reader for every caller that needs to know
// whether a pid is stopped or a zombie. Plain C++; no /proc (another OS, a sandbox) reads as
// "unknown", never as an error.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string_view>

namespace crun {

// The state letter of /proc/<pid>/stat: 'R', 'S', 'D', 'T' (stopped by a signal), 't'
// (stopped by a tracer), 'Z' (a zombie: dead, not yet reaped), ... Nothing when the process
// does not exist or /proc cannot be read.
std::optional<char> ProcessState(pid_t pid);

// The state letter in the text of a /proc/<pid>/stat file: the field after the command name,
// which is in parentheses and may itself hold spaces and ')'. Nothing when malformed.
std::optional<char> StateFromStat(std::string_view stat);

// The parent of `pid` (the field after the state in /proc/<pid>/stat); nothing when unknown.
std::optional<pid_t> ParentOf(pid_t pid);

}  // namespace crun
