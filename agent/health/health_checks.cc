#include "agent/health/health_checks.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "base/files.h"
#include "base/numbers.h"
#include "base/spelling.h"
#include "base/text.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
constexpr milliseconds kGpuPoll{250};  // between nvidia-smi's answers while GPU memory is held

std::vector<std::string> Fields(std::string_view line) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = line.find(',', start);
    out.emplace_back(
        Trim(line.substr(start, comma == std::string_view::npos ? line.npos : comma - start)));
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

// The rows of a CSV answer, each split into fields; blank lines skipped.
std::vector<std::vector<std::string>> Rows(std::string_view csv) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& line : SplitLines(csv)) {
    if (!Trim(line).empty()) rows.push_back(Fields(line));
  }
  return rows;
}

bool NoValue(const std::string& v) {
  return v == "[N/A]" || v == "N/A" || v == "[Not Supported]" || v == "Not Supported" || v.empty();
}
bool Broken(const std::string& v) {
  return v.find("Unknown Error") != std::string::npos || v.find("ERR!") != std::string::npos ||
         v.find("GPU is lost") != std::string::npos;
}

// Whether the GPU of `index` and `uuid` is one the workers see.
bool Visible(const std::string& index, const std::string& uuid,
             const std::vector<std::string>& visible) {
  if (visible.empty()) return true;
  return std::any_of(visible.begin(), visible.end(), [&](const std::string& v) {
    return v == index || (!v.empty() && uuid.starts_with(v));
  });
}

std::string GpuName(const std::string& index, const std::string& uuid) {
  return "GPU " + index + (uuid.empty() ? "" : " (" + uuid + ")");
}

std::string LastLines(const std::string& output, std::size_t n) {
  std::vector<std::string> kept;
  const auto lines = SplitLines(output);
  for (auto it = lines.rbegin(); it != lines.rend() && kept.size() < n; ++it) {
    if (!Trim(*it).empty()) kept.emplace_back(Trim(*it));
  }
  std::string out;
  for (auto it = kept.rbegin(); it != kept.rend(); ++it) out += (out.empty() ? "" : " | ") + *it;
  return out;
}

std::string JoinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : "; ") + l;
  return out;
}

// One gate run: every check at once, the verdict once the last has answered.
struct Gate final : HealthGateRun, std::enable_shared_from_this<Gate> {
  Gate(asio::io_context& io_, ChildRegistry& children_, const HealthGateOptions& o,
       std::function<void(HealthVerdict)> done_)
      : io(io_), children(children_), options(o), done(std::move(done_)), began(Clock::now()) {}

  void Start() {
    pending = options.checks.size() + 1;  // +1: this call, so that nothing ends inside it
    for (const auto& c : options.checks) {
      switch (c.kind) {
        case HealthCheck::Kind::kCommand:
          Command(c);
          break;
        case HealthCheck::Kind::kDisk:
          Finished(Disk(c));
          break;
        case HealthCheck::Kind::kMemory:
          Finished(Memory(c));
          break;
        case HealthCheck::Kind::kGpu:
          GpuState();
          break;
      }
    }
    asio::post(io, [self = shared_from_this()] { self->Finished(""); });
  }

  void Cancel() override {
    done = nullptr;
    if (poll) poll->cancel();
    for (auto& kill : kills) kill();
  }

  void Command(const HealthCheck& c) {
    kills.push_back(RunTool(io, children, {{"/bin/sh", "-c", c.spec}, options.env}, options.timeout,
                            [self = shared_from_this(), spec = c.spec](ToolResult r) {
                              self->Finished(JudgeCommand(spec, r));
                            }));
  }

  std::string Disk(const HealthCheck& c) {
    std::vector<std::string> bad;
    for (const auto& dir : options.dirs) {
      std::string path = dir + "/.crun-health-XXXXXX";
      const int fd = ::mkstemp(path.data());
      if (fd < 0) {
        bad.push_back("disk: cannot create a file in " + dir + ": " + std::strerror(errno));
        continue;
      }
      const bool wrote = ::write(fd, "ok\n", 3) == 3;
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      if (!wrote) {
        bad.push_back("disk: cannot write in " + dir + ": " + std::strerror(err));
        continue;
      }
      struct statvfs s {};
      if (::statvfs(dir.c_str(), &s) != 0) {
        bad.push_back("disk: cannot read the free space of " + dir + ": " + std::strerror(errno));
        continue;
      }
      const auto free = static_cast<std::uint64_t>(s.f_bavail) * s.f_frsize;
      if (auto why = JudgeFree("disk", dir, free, c.min_free, c.spec); !why.empty()) {
        bad.push_back(why);
      }
    }
    return JoinLines(bad);
  }

  std::string Memory(const HealthCheck& c) {
    std::ifstream in("/proc/meminfo");
    std::stringstream text;
    text << in.rdbuf();
    const auto available = AvailableMemory(text.str());
    if (!available) return "memory: /proc/meminfo has no MemAvailable";
    return JudgeFree("memory", "this node", *available, c.min_free, c.spec);
  }

  // ---- gpu: state, remapped rows, then the memory others hold ----

  milliseconds Left() const {
    const auto left =
        options.timeout - std::chrono::duration_cast<milliseconds>(Clock::now() - began);
    return std::max(left, milliseconds(1));
  }

  void Smi(std::vector<std::string> args, std::function<void(ToolResult)> then) {
    args.insert(args.begin(), options.nvidia_smi);
    std::erase_if(kills, [](const auto& k) { return !k; });
    kills.push_back(RunTool(io, children, {std::move(args), options.env}, Left(), std::move(then)));
  }

  static std::string SmiFailure(const ToolResult& r) {
    if (!r.started) return "gpu: nvidia-smi did not start: " + r.error;
    if (r.timed_out) return "gpu: nvidia-smi did not answer in time; killed";
    return "gpu: nvidia-smi failed with " + r.exit.Describe() + ": " +
           LastLines(r.output, kHealthOutputLines);
  }

  void GpuState() {
    Smi({"--query-gpu=index,uuid,ecc.errors.uncorrected.volatile.total,retired_pages.pending",
         "--format=csv,noheader,nounits"},
        [self = shared_from_this()](ToolResult r) {
          if (!r.ok()) return self->Finished(SmiFailure(r));
          auto bad = JudgeGpus(r.output, self->options.visible_gpus);
          if (!bad.empty()) return self->Finished(JoinLines(bad));
          self->uuids = VisibleUuids(r.output, self->options.visible_gpus);
          self->GpuRows();
        });
  }

  // Row remapping (A100 and later): drivers without the fields fail the query; no finding then.
  void GpuRows() {
    Smi({"--query-gpu=index,uuid,remapped_rows.pending,remapped_rows.failure",
         "--format=csv,noheader,nounits"},
        [self = shared_from_this()](ToolResult r) {
          if (r.timed_out) return self->Finished(SmiFailure(r));
          if (r.ok()) {
            auto bad = JudgeRemappedRows(r.output, self->options.visible_gpus);
            if (!bad.empty()) return self->Finished(JoinLines(bad));
          }
          self->GpuApps();
        });
  }

  // No process may hold the visible GPUs' memory: at a restart, the previous attempt's release
  // it as the driver tears their contexts down, so this waits for them until the deadline.
  void GpuApps() {
    Smi({"--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"},
        [self = shared_from_this()](ToolResult r) {
          const auto still_held = [&] {
            return "gpu: memory still held after " +
                   std::to_string(self->options.timeout.count() / 1000) +
                   " s: " + JoinLines(self->held);
          };
          // The deadline came during a poll: what holds the memory is what the last one saw.
          if (r.timed_out && !self->held.empty()) return self->Finished(still_held());
          if (!r.ok()) return self->Finished(SmiFailure(r));
          self->held = JudgeComputeApps(r.output, self->uuids);
          if (self->held.empty()) return self->Finished("");
          if (Clock::now() - self->began + kGpuPoll >= self->options.timeout) {
            return self->Finished(still_held());
          }
          if (!self->said_waiting) {
            self->said_waiting = true;
            spdlog::info("health check gpu: waiting up to {} s for GPU memory to be released: {}",
                         self->options.timeout.count() / 1000, JoinLines(self->held));
          }
          self->poll = std::make_unique<asio::steady_timer>(self->io, kGpuPoll);
          self->poll->async_wait([self](const boost::system::error_code& ec) {
            if (!ec && self->done) self->GpuApps();
          });
        });
  }

  void Finished(std::string failure) {
    if (!failure.empty()) verdict.failures.push_back(std::move(failure));
    if (--pending > 0 || !done) return;
    verdict.took = Clock::now() - began;
    std::exchange(done, nullptr)(std::move(verdict));
  }

  asio::io_context& io;
  ChildRegistry& children;
  HealthGateOptions options;
  std::function<void(HealthVerdict)> done;
  Clock::time_point began;
  std::size_t pending = 0;
  HealthVerdict verdict;
  std::vector<std::string> uuids;
  std::vector<std::string> held;  // the processes on the GPUs at the last poll
  std::unique_ptr<asio::steady_timer> poll;
  bool said_waiting = false;
  std::vector<std::function<void()>> kills;  // the programs' (RunTool)
};

}  // namespace

namespace {

// The builtins and reserved words of POSIX sh that a check may begin with: found on no PATH.
bool IsShellBuiltin(const std::string& word) {
  static const std::set<std::string> kBuiltins =
      {".",       "alias",    "bg",     "break", "case",   "cd",    "command", "continue",
       "echo",    "eval",     "exec",   "exit",  "export", "false", "fg",      "for",
       "getopts", "hash",     "if",     "jobs",  "kill",   "local", "printf",  "pwd",
       "read",    "readonly", "return", "set",   "shift",  "test",  "times",   "trap",
       "true",    "type",     "ulimit", "umask", "unset",  "until", "wait",    "while"};
  return kBuiltins.contains(word);
}

}  // namespace

StatusOr<HealthCheck> ParseHealthCheck(std::string_view spec, const std::string& nvidia_smi,
                                       const std::string& path) {
  const std::string text(Trim(spec));
  auto bad = [&](const std::string& why) {
    return InvalidArgument("--health-check '" + std::string(spec) + "': " + why);
  };
  if (text.empty()) return bad("is empty; give gpu, disk[:SIZE], memory[:SIZE] or a command");
  HealthCheck c;
  c.spec = text;
  if (text == "gpu") {
    if (nvidia_smi.empty()) {
      return bad(
          "needs nvidia-smi, which is not on PATH (install the NVIDIA driver's utilities, "
          "or drop the check on a node without GPUs)");
    }
    c.kind = HealthCheck::Kind::kGpu;
    return c;
  }
  for (const auto& [name, kind, min] :
       {std::tuple{"disk", HealthCheck::Kind::kDisk, kDefaultMinFreeDisk},
        std::tuple{"memory", HealthCheck::Kind::kMemory, kDefaultMinFreeMemory}}) {
    const std::string n(name);
    if (text != n && !text.starts_with(n + ":")) continue;
    c.kind = kind;
    c.min_free = min;
    if (text.size() > n.size()) {
      const auto size = ParseByteSize(text.substr(n.size() + 1));
      if (!size || *size == 0) {
        return bad("'" + text.substr(n.size() + 1) +
                   "' is not a size above 0 such as 512M or 8G (units K, M, G, T)");
      }
      c.min_free = *size;
    }
    return c;
  }
  // A command. Its first word, when it is a plain name (not a path, an assignment, a quote or
  // other shell syntax), must be something the shell can run.
  const std::string word = text.substr(0, text.find_first_of(" \t"));
  const bool plain = std::all_of(word.begin(), word.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.' ||
           ch == ':' || ch == '+';
  });
  if (plain && !IsShellBuiltin(word) && FindOnPath(word, path).empty()) {
    std::string why = "no command '" + word + "' on PATH";
    const std::string best = ClosestName(word.substr(0, word.find(':')), {"gpu", "disk", "memory"});
    if (!best.empty()) why += " (did you mean " + best + "?)";
    return bad(why + "; give gpu, disk[:SIZE], memory[:SIZE] or a command");
  }
  c.kind = HealthCheck::Kind::kCommand;
  return c;
}

std::string HealthVerdict::Describe() const { return JoinLines(failures); }

std::shared_ptr<HealthGateRun> RunHealthGate(asio::io_context& io, ChildRegistry& children,
                                             const HealthGateOptions& options,
                                             std::function<void(HealthVerdict)> done) {
  auto gate = std::make_shared<Gate>(io, children, options, std::move(done));
  gate->Start();
  return gate;
}

void NoteUnhealthyNode(const std::string& path, const std::string& host) {
  if (path.empty()) return;
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  const std::string line = host + "\n";
  if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    spdlog::warn("cannot note this node in {}: {}", path, std::strerror(errno));
  }
  if (fd >= 0) ::close(fd);
}

std::string JudgeCommand(const std::string& spec, const ToolResult& run) {
  if (run.ok()) return "";
  std::string why = "health check `" + spec + "` ";
  if (!run.started) return why + "could not start: " + run.error;
  why += run.timed_out ? "did not finish in time; killed" : "failed with " + run.exit.Describe();
  const auto tail = LastLines(run.output, kHealthOutputLines);
  return why + (tail.empty() ? " (no output)" : ": " + tail);
}

std::vector<std::string> JudgeGpus(std::string_view csv, const std::vector<std::string>& visible) {
  std::vector<std::string> bad;
  std::size_t seen = 0;
  for (const auto& row : Rows(csv)) {
    if (row.size() < 4) {
      bad.push_back("gpu: nvidia-smi's answer has a line of " + std::to_string(row.size()) +
                    " fields, not 4");
      continue;
    }
    const auto& index = row[0];
    const auto& uuid = row[1];
    if (!Visible(index, uuid, visible)) continue;
    ++seen;
    const std::string gpu = GpuName(index, uuid);
    if (Broken(row[2]) || Broken(row[3]) || Broken(uuid)) {
      bad.push_back("gpu: " + gpu + " does not answer (" + row[2] + ", " + row[3] + ")");
      continue;
    }
    if (!NoValue(row[2])) {
      const auto errors = ParseInteger(row[2], 0, INT64_MAX);
      if (!errors) {
        bad.push_back("gpu: " + gpu + " reports '" + row[2] + "' uncorrectable ECC errors");
      } else if (*errors > 0) {
        bad.push_back("gpu: " + gpu + " has " + row[2] +
                      " uncorrectable ECC errors since the driver loaded");
      }
    }
    if (row[3] == "Yes") {
      bad.push_back("gpu: " + gpu + " has retired pages pending: it needs a reset");
    }
  }
  if (seen == 0) bad.push_back("gpu: nvidia-smi lists none of the GPUs this node should use");
  return bad;
}

std::vector<std::string> JudgeRemappedRows(std::string_view csv,
                                           const std::vector<std::string>& visible) {
  std::vector<std::string> bad;
  for (const auto& row : Rows(csv)) {
    if (row.size() < 4 || !Visible(row[0], row[1], visible)) continue;
    const std::string gpu = GpuName(row[0], row[1]);
    if (row[2] == "Yes" || row[2] == "1") {
      bad.push_back("gpu: " + gpu + " has rows pending remapping: it needs a reset");
    }
    if (row[3] == "Yes" || row[3] == "1") {
      bad.push_back("gpu: " + gpu + " failed to remap a row: it needs service");
    }
  }
  return bad;
}

std::vector<std::string> VisibleUuids(std::string_view csv,
                                      const std::vector<std::string>& visible) {
  std::vector<std::string> out;
  for (const auto& row : Rows(csv)) {
    if (row.size() >= 2 && Visible(row[0], row[1], visible)) out.push_back(row[1]);
  }
  return out;
}

std::vector<std::string> JudgeComputeApps(std::string_view csv,
                                          const std::vector<std::string>& uuids) {
  std::vector<std::string> held;
  for (const auto& row : Rows(csv)) {
    if (row.size() < 3) continue;
    if (std::find(uuids.begin(), uuids.end(), row[1]) == uuids.end()) continue;
    held.push_back("process " + row[0] + " holds " +
                   (NoValue(row[2]) ? std::string("memory") : row[2] + " MiB") + " on " + row[1]);
  }
  return held;
}

std::string JudgeFree(const std::string& what, const std::string& where, std::uint64_t free,
                      std::uint64_t min, const std::string& spec) {
  if (free >= min) return "";
  return what + ": " + where + " has " + FormatBytes(free) + " free, below the " +
         FormatBytes(min) + " asked (--health-check " + spec + ")";
}

std::optional<std::uint64_t> AvailableMemory(std::string_view meminfo) {
  for (const auto& line : SplitLines(meminfo)) {
    std::string_view l(line);
    if (!l.starts_with("MemAvailable:")) continue;
    l = Trim(l.substr(13));
    const auto space = l.find(' ');
    const auto kib = ParseInteger(l.substr(0, space), 0, INT64_MAX / 1024);
    if (!kib) return std::nullopt;
    return static_cast<std::uint64_t>(*kib) * 1024;
  }
  return std::nullopt;
}

}  // namespace crun::agent
