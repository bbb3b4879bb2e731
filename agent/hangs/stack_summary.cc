#include "agent/hangs/stack_summary.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace crun::agent {
namespace {

// C library and kernel-interface frames every waiting thread has on top: not where it waits.
bool IsWaitPrimitive(const std::string& function) {
  static const char* const kNames[] = {"clock_nanosleep",
                                       "nanosleep",
                                       "sleep",
                                       "usleep",
                                       "pause",
                                       "poll",
                                       "ppoll",
                                       "select",
                                       "pselect",
                                       "epoll_wait",
                                       "epoll_pwait",
                                       "read",
                                       "recv",
                                       "recvmsg",
                                       "recvfrom",
                                       "write",
                                       "futex_wait",
                                       "syscall",
                                       "pthread_cond_wait",
                                       "pthread_cond_timedwait",
                                       "sem_wait",
                                       "pthread_join",
                                       "wait4",
                                       "waitpid",
                                       "accept",
                                       "connect",
                                       "do_futex_wait",
                                       "futex_abstimed_wait_common",
                                       "pthread_cond_clockwait",
                                       "__pthread_clockjoin_ex"};
  std::string name = function;
  if (const auto at = name.find('@'); at != std::string::npos) name.resize(at);
  while (!name.empty() && name.front() == '_') name.erase(0, 1);
  if (name.starts_with("GI_")) name.erase(0, 3);
  while (!name.empty() && name.front() == '_') name.erase(0, 1);
  for (const char* n : kNames) {
    std::string_view k(n);
    while (!k.empty() && k.front() == '_') k.remove_prefix(1);
    if (name == k) return true;
  }
  return name.empty() || name == "??";
}

// A function name short enough for a summary line: no arguments, no template arguments.
std::string ShortName(const std::string& given) {
  std::string function = given;
  static const std::string kAnonymous = "(anonymous namespace)::";
  for (auto at = function.find(kAnonymous); at != std::string::npos;
       at = function.find(kAnonymous)) {
    function.erase(at, kAnonymous.size());
  }
  std::string out;
  int depth = 0;
  for (char c : function) {
    if (c == '<' && !out.empty() && out.back() != '<' && out != "operator") {
      ++depth;
      continue;
    }
    if (c == '>' && depth > 0) {
      --depth;
      continue;
    }
    if (depth > 0) continue;
    if (c == '(' && !out.empty()) break;
    out.push_back(c);
  }
  return out.empty() ? function : out;
}

const ThreadStack* MainThread(const RankStacks& stacks) {
  for (const auto& t : stacks.threads) {
    if (t.main) return &t;
  }
  return stacks.threads.empty() ? nullptr : &stacks.threads.front();
}

// A frame of a collective: torch.distributed's c10d API, or a collective by name (the SDK's,
// Gloo's, NCCL's).
bool IsCollectiveFrame(const Frame& f) {
  if (f.file.find("distributed_c10d.py") != std::string::npos) return true;
  std::string name;
  for (char c : f.function)
    name.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (name.find("nccl") != std::string::npos) return true;
  for (const char* k : {"allreduce", "all_reduce", "allgather", "all_gather", "reducescatter",
                        "reduce_scatter", "broadcast", "barrier", "alltoall", "all_to_all"}) {
    if (name.find(k) != std::string::npos) return true;
  }
  return false;
}

// The thread that says where a rank is: its main thread, unless that only waits for another
// thread ("...Wait", the SDK's executor) that is in a collective: then that one.
const ThreadStack* PlaceThread(const RankStacks& stacks) {
  const ThreadStack* main = MainThread(stacks);
  const auto& frames = main->frames;
  if (std::any_of(frames.begin(), frames.end(), IsCollectiveFrame)) return main;
  const auto top = std::find_if(frames.begin(), frames.end(),
                                [](const Frame& f) { return !IsWaitPrimitive(f.function); });
  if (top == frames.end() || top->function.find("Wait") == std::string::npos) return main;
  for (const auto& t : stacks.threads) {
    for (const auto& f : t.frames) {
      if (IsCollectiveFrame(f)) return &t;
    }
  }
  return main;
}

// Any thread: the SDK runs its collectives on a thread of its own, which the main thread waits
// for.
bool InCollective(const RankStacks& stacks) {
  for (const auto& t : stacks.threads) {
    for (const auto& f : t.frames) {
      if (IsCollectiveFrame(f)) return true;
    }
  }
  return false;
}

}  // namespace

std::string WhereWaiting(const RankStacks& stacks) {
  if (stacks.threads.empty()) {
    return "no stack (" + (stacks.error.empty() ? std::string("nothing read") : stacks.error) + ")";
  }
  const ThreadStack* main = PlaceThread(stacks);
  if (main->frames.empty()) {
    // A thread read with no frame in it: a worker still starting ("<no Python frame>").
    return "no frame in " + (main->title.empty() ? std::string("its main thread") : main->title) +
           " (" + stacks.tool + ")";
  }
  const bool native = stacks.tool == "eu-stack" || stacks.tool == "gdb";
  std::vector<std::string> names;
  for (const auto& f : main->frames) {
    if (native && names.empty() && IsWaitPrimitive(f.function)) continue;
    names.push_back(native ? ShortName(f.function) : f.function);
    if (names.size() == 3) break;
  }
  if (names.empty()) return "in the C library (" + main->frames.front().function + ")";
  std::string out = "in `" + names[0] + "`";
  for (std::size_t i = 1; i < names.size(); ++i) out += " <- `" + names[i] + "`";
  return out;
}

std::set<int> SuspectRanks(const std::vector<RankStacks>& ranks) {
  std::set<int> all, waiting, free;
  std::map<std::string, std::set<int>> groups;
  for (const auto& r : ranks) {
    all.insert(r.rank);
    if (r.threads.empty()) continue;
    (InCollective(r) ? waiting : free).insert(r.rank);
    groups[WhereWaiting(r)].insert(r.rank);
  }
  if (!waiting.empty() && !free.empty()) return free;
  if (groups.size() > 1) {
    std::size_t smallest = all.size(), count = 0;
    for (const auto& [where, members] : groups) smallest = std::min(smallest, members.size());
    const std::set<int>* only = nullptr;
    for (const auto& [where, members] : groups) {
      if (members.size() == smallest) {
        ++count;
        only = &members;
      }
    }
    if (count == 1) return *only;
  }
  return all;
}

std::string RankRanges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::vector<std::string> GroupSummary(const std::vector<RankStacks>& ranks,
                                      const std::set<int>& first) {
  std::map<std::string, std::vector<int>> groups;
  for (const auto& r : ranks) groups[WhereWaiting(r)].push_back(r.rank);
  std::vector<std::pair<std::string, std::vector<int>>> sorted(groups.begin(), groups.end());
  auto leads = [&](const std::vector<int>& members) {
    return std::any_of(members.begin(), members.end(), [&](int r) { return first.count(r) > 0; });
  };
  std::stable_sort(sorted.begin(), sorted.end(), [&](const auto& a, const auto& b) {
    if (leads(a.second) != leads(b.second)) return leads(a.second);
    if (a.second.size() != b.second.size()) return a.second.size() < b.second.size();
    return *std::min_element(a.second.begin(), a.second.end()) <
           *std::min_element(b.second.begin(), b.second.end());
  });
  std::vector<std::string> out;
  for (const auto& [where, members] : sorted) {
    out.push_back((members.size() == 1 ? "rank " : "ranks ") + RankRanges(members) + ": " + where);
  }
  return out;
}

std::string FormatStacks(const std::vector<RankStacks>& ranks, const std::set<int>& always) {
  std::string out;
  for (const auto& line : GroupSummary(ranks, always)) out += "  " + line + "\n";
  std::set<std::string> shown_places;
  std::vector<int> left_out;
  out += "Stacks:\n";
  for (const auto& s : ranks) {
    const bool first_of_group = shown_places.insert(WhereWaiting(s)).second;
    if (ranks.size() <= 8 || first_of_group || always.count(s.rank)) {
      std::istringstream in(FormatRankStacks(s));
      std::string line;
      while (std::getline(in, line)) out += "  " + line + "\n";
    } else {
      left_out.push_back(s.rank);
    }
  }
  if (!left_out.empty()) {
    out += "  (ranks " + RankRanges(left_out) + ": in the same places as shown above)\n";
  }
  return out;
}

std::string FormatRankStacks(const RankStacks& s) {
  std::string out = "rank " + std::to_string(s.rank) + " (local rank " +
                    std::to_string(s.local_rank) + ", pid " + std::to_string(s.pid) +
                    (s.host.empty() ? "" : ", " + s.host) + ")";
  if (s.tool.empty()) return out + ": no stack: " + s.error + "\n";
  out += ", by " + s.tool + ":\n";
  for (const auto& t : s.threads) {
    out += "  " + t.title + (t.main ? "  [main thread]" : "") + "\n";
    for (const auto& f : t.frames) {
      out += "    " + f.function;
      if (!f.file.empty())
        out += " (" + f.file + (f.line > 0 ? ":" + std::to_string(f.line) : "") + ")";
      out += "\n";
    }
  }
  return out;
}

nlohmann::json StacksJson(const RankStacks& s) {
  nlohmann::json threads = nlohmann::json::array();
  for (const auto& t : s.threads) {
    nlohmann::json frames = nlohmann::json::array();
    for (const auto& f : t.frames) {
      frames.push_back({{"function", f.function}, {"file", f.file}, {"line", f.line}});
    }
    threads.push_back({{"title", t.title}, {"main", t.main}, {"frames", std::move(frames)}});
  }
  return {{"host", s.host},   {"rank", s.rank}, {"local_rank", s.local_rank},
          {"pid", s.pid},     {"tool", s.tool}, {"where", WhereWaiting(s)},
          {"error", s.error}, {"text", s.text}, {"threads", std::move(threads)}};
}

RankStacks StacksFromJson(const nlohmann::json& j) {
  RankStacks s;
  s.host = j.value("host", "");
  s.rank = j.value("rank", 0);
  s.local_rank = j.value("local_rank", 0);
  s.pid = j.value("pid", 0);
  s.tool = j.value("tool", "");
  s.error = j.value("error", "");
  s.text = j.value("text", "");
  if (j.contains("threads") && j["threads"].is_array()) {
    for (const auto& t : j["threads"]) {
      ThreadStack ts;
      ts.title = t.value("title", "");
      ts.main = t.value("main", false);
      if (t.contains("frames") && t["frames"].is_array()) {
        for (const auto& f : t["frames"]) {
          ts.frames.push_back({f.value("function", ""), f.value("file", ""), f.value("line", 0)});
        }
      }
      s.threads.push_back(std::move(ts));
    }
  }
  return s;
}

}  // namespace crun::agent
