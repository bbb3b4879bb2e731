// What the kernel says of a process in /proc: one reader for every caller that needs to know
// whether a pid is stopped or a zombie. Plain C++; no /proc (another OS, a sandbox) reads as
// "unknown", never as an error.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// For a long-lived server once it is ready: gives back the pages of read-only file mappings
// (code and constants of crun and its C libraries) that start-up touched, static initializers
// and command-line parsing mostly, and that serving does not use (MADV_DONTNEED: the page
// cache keeps them; a page touched again is mapped again from it, a minor fault). Only
// mappings without a private copy of any page: relocated read-only data (RELRO) has one and
// is left alone. Returns the bytes given back (their resident size before).
std::size_t ReleaseStartupPages();

// The mappings ReleaseStartupPages() may release, from the text of /proc/self/smaps: each
// "start-end" range as numbers. Exposed for tests.
struct Mapping {
  std::uintptr_t start = 0, end = 0;
  std::size_t rss_kib = 0;
};
std::vector<Mapping> ReleasableMappings(std::string_view smaps);

// A process with a socket on a TCP port: its pid and its command name (/proc/<pid>/comm).
struct PortHolder {
  pid_t pid = 0;
  std::string name;
};

// The processes this user can see with a socket on TCP `port` in this network namespace,
// listening or connected; empty when none is visible (another user's process, or nobody).
std::vector<PortHolder> TcpPortHolderList(std::uint16_t port);

// The same for a message: "pid 123 (python3)" for each, joined by ", "; empty when none.
std::string TcpPortHolders(std::uint16_t port);

// The socket inodes of the lines of a /proc/net/tcp or tcp6 text whose local port is `port`.
// Exposed for tests.
std::vector<std::uint64_t> SocketInodesOnPort(std::string_view proc_net_tcp, std::uint16_t port);

}  // namespace crun
