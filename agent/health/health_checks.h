// The health gate (docs/health.md): checks a node runs before each join, so that a sick node
// (a GPU with errors, a full disk, too little memory, or whatever the operator's own command
// says) stays out of the round instead of joining and failing again.
//
// --health-check SPEC, repeatable: `gpu`, `disk[:SIZE]`, `memory[:SIZE]` are built in; anything
// else is a shell command (/bin/sh -c) that passes by exiting 0. Every check of a join runs at
// once, each within the gate's deadline; the verdict names every check that failed, with its
// exit and the last lines of its output.
//
// What here decides is pure (parsing a spec, judging nvidia-smi's answers, free space): the
// gate (RunHealthGate) only runs the programs and reads the machine.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/supervise/children.h"
#include "agent/supervise/tool_run.h"
#include "base/status.h"

namespace crun::agent {

inline constexpr std::uint64_t kDefaultMinFreeDisk = std::uint64_t{1} << 30;    // 1 GiB
inline constexpr std::uint64_t kDefaultMinFreeMemory = std::uint64_t{1} << 30;  // 1 GiB
inline constexpr std::chrono::milliseconds kDefaultHealthTimeout{60'000};
// Lines of a failed check's output the verdict quotes.
inline constexpr std::size_t kHealthOutputLines = 5;

struct HealthCheck {
  enum class Kind { kCommand, kGpu, kDisk, kMemory };
  Kind kind = Kind::kCommand;
  std::string spec;            // as given: "gpu", "disk:10G", "test -e /mnt/data/ready"
  std::uint64_t min_free = 0;  // disk, memory
};

// One --health-check value. `nvidia_smi`: where nvidia-smi is (empty: not found), which `gpu`
// needs. `path`: the PATH a command runs with; a command whose first word is a plain name that
// is neither a shell builtin nor on it ("gpus", "dsk:10G") is refused as the typo it most likely
// is, with the built-in it is closest to. Errors name the flag and the value.
StatusOr<HealthCheck> ParseHealthCheck(std::string_view spec, const std::string& nvidia_smi,
                                       const std::string& path);

// What the gate is given, once per job.
struct HealthGateOptions {
  std::vector<HealthCheck> checks;
  std::chrono::milliseconds timeout = kDefaultHealthTimeout;  // each check's, and the GPU wait's
  std::vector<std::string> dirs;          // `disk`: the log and checkpoint directories
  std::string nvidia_smi;                 // `gpu`: its path
  std::vector<std::string> visible_gpus;  // CUDA_VISIBLE_DEVICES's entries; empty: every GPU
  std::vector<std::string> env;           // the commands' environment ("KEY=VALUE"): crun's
};

struct HealthVerdict {
  std::vector<std::string> failures;  // one line per check that failed
  std::chrono::steady_clock::duration took{};
  bool ok() const { return failures.empty(); }
  // "health check `exit 3` failed with exit code 3: ...; gpu: GPU 1 ..."
  std::string Describe() const;
};

// A gate under way.
class HealthGateRun {
 public:
  virtual ~HealthGateRun() = default;
  // Ends it now: its programs are killed, and its `done` is never called.
  virtual void Cancel() = 0;
};

// Runs every check at once and calls `done` on `io` with the verdict (never from inside this
// call). The programs run as children owned in `children`.
std::shared_ptr<HealthGateRun> RunHealthGate(boost::asio::io_context& io, ChildRegistry& children,
                                             const HealthGateOptions& options,
                                             std::function<void(HealthVerdict)> done);

// Appends `host` and a newline to `path` in one write (O_APPEND, created 0644 if absent), so
// that the nodes of a job may share one file: what an sbatch script reads to requeue without
// them (docs/health.md). Empty path: nothing. A failure is logged, never fatal.
void NoteUnhealthyNode(const std::string& path, const std::string& host);

// ---- the pure parts ----------------------------------------------------------------------

// A command check's verdict from its run: "" when it passed, else "health check `CMD` failed
// with exit code 3: <its last lines, joined by ' | '>".
std::string JudgeCommand(const std::string& spec, const ToolResult& run);

// `nvidia-smi --query-gpu=index,uuid,ecc.errors.uncorrected.volatile.total,retired_pages.pending
// --format=csv,noheader,nounits`: a line per GPU that is not healthy, for the visible ones.
// "[N/A]" and "[Not Supported]" are no finding; "[Unknown Error]", "ERR!" or a missing row are.
std::vector<std::string> JudgeGpus(std::string_view csv, const std::vector<std::string>& visible);
// `--query-gpu=index,uuid,remapped_rows.pending,remapped_rows.failure`: rows the GPU must remap
// (a reset is due) or could not.
std::vector<std::string> JudgeRemappedRows(std::string_view csv,
                                           const std::vector<std::string>& visible);
// `--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits` against the
// visible GPUs (`uuids`, from the first query): the processes that hold their memory.
std::vector<std::string> JudgeComputeApps(std::string_view csv,
                                          const std::vector<std::string>& uuids);
// The visible GPUs' uuids from the first query's answer.
std::vector<std::string> VisibleUuids(std::string_view csv,
                                      const std::vector<std::string>& visible);

// Free space: "" or "disk: /logs has 120.0 MiB free, below the 1.00 GiB asked (--health-check
// disk)".
std::string JudgeFree(const std::string& what, const std::string& where, std::uint64_t free,
                      std::uint64_t min, const std::string& spec);
// MemAvailable from /proc/meminfo's text, in bytes.
std::optional<std::uint64_t> AvailableMemory(std::string_view meminfo);

}  // namespace crun::agent
