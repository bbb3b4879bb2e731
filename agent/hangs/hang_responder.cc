#include "agent/hangs/hang_responder.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

#include "agent/hangs/stack_summary.h"
#include "base/fd_writer.h"
#include "base/files.h"

namespace crun::agent {
namespace {

namespace asio = boost::asio;

// PyTorch looks at the flight recorder's dump pipe about once a second and then writes its
// trace: the group is stopped only once every asked rank's file is there and has stopped
// growing, or after this.
constexpr std::chrono::seconds kTraceWait{10};

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

struct TraceSize {
  std::uintmax_t size = 0;
  std::chrono::steady_clock::time_point since;
};
using TraceSizes = std::map<std::string, TraceSize>;

// The files not yet complete: absent, empty, or grown within the last 0.5 s.
std::vector<std::string> PendingTraces(const std::vector<std::string>& files, TraceSizes& sizes) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> pending;
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(f, ec);
    auto& seen = sizes[f];
    if (ec || size == 0 || size != seen.size) {
      seen = {ec ? 0 : size, now};
      pending.push_back(f);
    } else if (now - seen.since < std::chrono::milliseconds(500)) {
      pending.push_back(f);
    }
  }
  return pending;
}

void PollTraces(asio::io_context& io, std::vector<std::string> files,
                std::chrono::steady_clock::time_point deadline, std::chrono::seconds wait,
                std::function<void(std::string)> done, std::shared_ptr<TraceSizes> sizes) {
  const std::vector<std::string> pending = PendingTraces(files, *sizes);
  if (pending.empty() || std::chrono::steady_clock::now() >= deadline) {
    std::string note =
        pending.empty()
            ? "NCCL flight recorder: every trace written (" + std::to_string(files.size()) +
                  " files)"
            : "NCCL flight recorder: not written within " + std::to_string(wait.count()) +
                  " s: " + pending.front() +
                  (pending.size() > 1 ? " and " + std::to_string(pending.size() - 1) + " more"
                                      : "");
    return asio::post(io, [done, note] { done(note); });
  }
  auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(100));
  timer->async_wait([&io, timer, files = std::move(files), deadline, wait, done,
                     sizes](const boost::system::error_code& ec) mutable {
    if (ec) return;
    PollTraces(io, std::move(files), deadline, wait, std::move(done), std::move(sizes));
  });
}

}  // namespace

// This node's ranks and, through the service, every other node's, read at once, with the
// flight recorder's traces; the report waits for all three.
struct HangResponder::Gather {
  HangReport h;
  std::optional<std::vector<RankStacks>> local;
  std::optional<RemoteStacks> remote;
  bool traces_done = false;
  bool ready() const { return local && remote && traces_done; }
};

HangResponder::HangResponder(asio::io_context& io, ChildRegistry& children,
                             HangResponderOptions options, Targets targets, AskRemote ask_remote,
                             IsCurrent is_current, Concluded concluded)
    : io_(io),
      children_(children),
      options_(std::move(options)),
      targets_(std::move(targets)),
      ask_remote_(std::move(ask_remote)),
      is_current_(std::move(is_current)),
      concluded_(std::move(concluded)) {}

const StackTools& HangResponder::Tools() {
  if (!tools_) tools_ = FindStackTools(options_.tool_path, {options_.program_dir});
  return *tools_;
}

void HangResponder::ReadStacks(std::function<void(const std::vector<RankStacks>&)> done) {
  stack_waiters_.push_back(std::move(done));
  if (stack_waiters_.size() > 1) return;  // joins the capture under way
  CaptureStacks(io_, children_, targets_(), Tools(), options_.stack_deadline,
                [this](std::vector<RankStacks> stacks) {
                  for (auto& w : std::exchange(stack_waiters_, {})) w(stacks);
                });
}

HangReport HangResponder::StartReport(const HangAttempt& a,
                                      const std::vector<WorkerProgress>& progress) {
  HangReport h;
  for (const auto& p : progress) {
    HangReport::Rank r;
    r.host = options_.host_name;
    r.rank = a.base_rank + p.local_rank;
    r.local_rank = p.local_rank;
    r.pid = p.pid;
    r.hung = p.hung;
    r.silent_s = static_cast<double>(p.silent.count()) / 1000.0;
    r.state = p.state;
    r.cause = p.cause;
    if (p.hung && p.limit.count() > 0) {
      h.declared_late_ms =
          std::max(h.declared_late_ms, static_cast<double>((p.silent - p.limit).count()));
    }
    if (p.hung) {
      spdlog::warn(
          "rank {} (local rank {}, pid {}) on {} is hung: {}; reading every rank's stacks "
          "before stopping the group",
          r.rank, r.local_rank, r.pid, r.host, r.cause);
    }
    h.ranks.push_back(std::move(r));
  }
  return h;
}

void HangResponder::OnHang(const HangAttempt& a, const std::vector<WorkerProgress>& progress) {
  if (gathering_) return;
  gathering_ = true;
  const auto when = std::chrono::system_clock::now();
  const auto declared = std::chrono::steady_clock::now();
  auto g = std::make_shared<Gather>();
  g->h = StartReport(a, progress);
  std::vector<int> ranks;
  for (const auto& t : targets_()) ranks.push_back(t.rank);
  std::vector<std::string> traces;  // the flight recorder's files, when it was asked
  g->h.notes = TriggerFlightRecorder(ranks, &traces);
  std::string why;
  for (const auto& r : g->h.ranks) {
    if (!r.hung) continue;
    why += (why.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r.rank) + " on " +
           r.host + " hung: " + r.cause;
  }
  auto conclude = [this, g, a, when, declared] {
    if (!g->ready()) return;
    gathering_ = false;
    if (!is_current_(a.attempt)) return;  // that attempt is over
    HangReport& report = g->h;
    report.stacks = std::move(*g->local);
    report.stacks.insert(report.stacks.end(), g->remote->ranks.begin(), g->remote->ranks.end());
    std::sort(report.stacks.begin(), report.stacks.end(),
              [](const auto& x, const auto& y) { return x.rank < y.rank; });
    for (const auto& m : g->remote->missing) report.notes.push_back("no stacks from " + m);
    report.stacks_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - declared)
            .count();
    Finish(a, std::move(report), when, declared);
  };
  ReadStacks([g, conclude](const std::vector<RankStacks>& stacks) {
    g->local = stacks;
    conclude();
  });
  WaitForTraces(io_, std::move(traces), kTraceWait, [g, conclude](std::string note) {
    if (!note.empty()) g->h.notes.push_back(std::move(note));
    g->traces_done = true;
    conclude();
  });
  ask_remote_(why, options_.stack_deadline + std::chrono::seconds(2),
              [g, conclude](RemoteStacks remote) {
                g->remote = std::move(remote);
                conclude();
              });
}

void HangResponder::Finish(const HangAttempt& a, HangReport h,
                           std::chrono::system_clock::time_point when,
                           std::chrono::steady_clock::time_point declared) {
  h.stacks_dir = WriteStacks(a.round, h.stacks);
  JudgeHang(h);
  // Deadline -> report: how late it was declared, then the stacks.
  h.report_ms = h.declared_late_ms + h.stacks_ms;
  const std::string rule(72, '=');
  FdWriter::Stderr().Write(rule + "\ncrun: " + options_.entrypoint + " hung (run " + a.run_id +
                           ", attempt " + std::to_string(a.restart_count) + ")\n" + FormatHang(h) +
                           rule + "\n");
  const std::string json = options_.log_dir + "/attempt_" + std::to_string(a.round) + "/hang.json";
  // Stacks are the tools' text: bytes that are not UTF-8 are written as U+FFFD.
  const auto text = HangJson(h).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  if (!WriteWholeFile(json, text + "\n")) spdlog::warn("cannot write {}", json);
  concluded_(a.attempt, std::move(h), when, declared);
}

void JudgeHang(HangReport& h) {
  // Ranks that fell silent together: the stacks tell the one that holds the others up from
  // those waiting for it in a collective.
  std::set<int> silent;
  for (const auto& r : h.ranks) {
    if (r.hung) silent.insert(r.rank);
  }
  const std::set<int> suspects = SuspectRanks(h.stacks);
  std::set<int> culprits;
  for (int rank : suspects) {
    if (silent.count(rank)) culprits.insert(rank);
  }
  if (silent.size() > 1 && !culprits.empty()) {
    for (auto& r : h.ranks) {
      if (r.hung && !culprits.count(r.rank)) {
        r.hung = false;
        r.cause.clear();
      }
    }
  }
  if (!culprits.empty() || suspects.size() >= h.stacks.size()) return;
  // Every rank here waits for ranks on other nodes: this node's failure names them, so that
  // whichever node's report arrives first, the root cause says who held the job up.
  std::string who;
  for (const auto& s : h.stacks) {
    if (!suspects.count(s.rank)) continue;
    who += (who.empty() ? "" : "; ") + std::string("rank ") + std::to_string(s.rank) + " on " +
           s.host + " (" + WhereWaiting(s) + ")";
  }
  for (auto& r : h.ranks) {
    if (r.hung) r.cause += "; by every node's stacks it waits for " + who;
  }
}

void HangResponder::ShowForOtherNode(int round, const std::string& reason,
                                     const std::vector<RankStacks>& stacks) {
  const std::string dir = WriteStacks(round, stacks);
  std::string lines;
  for (const auto& line : GroupSummary(stacks)) lines += "  " + line + "\n";
  FdWriter::Stderr().Write("crun: where this node's ranks were (" + reason + "):\n" + lines +
                           (dir.empty() ? "" : "  full stacks: " + dir + "\n"));
}

// Each rank's stacks in attempt_<round>/stacks/rank_<r>.txt; the directory, or "".
std::string HangResponder::WriteStacks(int round, const std::vector<RankStacks>& stacks) {
  const std::string dir = options_.log_dir + "/attempt_" + std::to_string(round) + "/stacks";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  bool ok = !ec;
  for (const auto& s : stacks) {
    const std::string text =
        FormatRankStacks(s) + (s.text.empty() ? "" : "\n--- " + s.tool + " output ---\n" + s.text);
    ok = ok && WriteWholeFile(dir + "/rank_" + std::to_string(s.rank) + ".txt", text);
  }
  if (!ok) {
    spdlog::warn("cannot write the stacks under {}", dir);
    return "";
  }
  return dir;
}

std::vector<std::string> TriggerFlightRecorder(const std::vector<int>& ranks,
                                               std::vector<std::string>* traces) {
  std::vector<std::string> notes;
  for (const char* name : {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE"}) {
    const std::string pipe_prefix = EnvOr(name, "");
    if (pipe_prefix.empty()) continue;
    std::vector<int> asked, absent;
    for (int rank : ranks) {
      const std::string pipe = pipe_prefix + std::to_string(rank) + ".pipe";
      const int fd = ::open(pipe.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      (fd >= 0 && ::write(fd, "1\n", 2) == 2 ? asked : absent).push_back(rank);
      if (fd >= 0) ::close(fd);
    }
    const std::string prefix = EnvOr("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/tmp/nccl_trace_rank_");
    for (int rank : asked) traces->push_back(prefix + std::to_string(rank));
    if (!asked.empty()) {
      notes.push_back("NCCL flight recorder: dump asked of ranks " + RankRanges(asked) +
                      " (written to " + pipe_prefix + "<rank>.pipe); PyTorch writes it to " +
                      prefix + "<rank> (read it with torchfrtrace)");
    }
    if (!absent.empty()) {
      notes.push_back("NCCL flight recorder: ranks " + RankRanges(absent) + " have no open " +
                      pipe_prefix +
                      "<rank>.pipe (no NCCL group yet, or TORCH_NCCL_TRACE_BUFFER_SIZE unset)");
    }
  }
  return notes;
}

void WaitForTraces(asio::io_context& io, std::vector<std::string> files, std::chrono::seconds wait,
                   std::function<void(std::string)> done) {
  if (files.empty()) return asio::post(io, [done] { done(""); });
  PollTraces(io, std::move(files), std::chrono::steady_clock::now() + wait, wait, std::move(done),
             std::make_shared<TraceSizes>());
}

}  // namespace crun::agent
