#include "launcher/slurm.h"

#include <cctype>
#include <cstdlib>
#include <limits>

#include "base/numbers.h"

namespace crun::launcher {
namespace {

// More hosts than any cluster has: a list that expands past this is a typo, not a job.
constexpr std::size_t kMaxHosts = std::size_t{1} << 20;

StatusOr<std::int64_t> Number(std::string_view digits, std::string_view list) {
  // Digits only (a '-' here would be a range's), at most 18 of them.
  const auto v =
      digits.size() <= 18 ? ParseInteger(digits, 0, 999'999'999'999'999'999) : std::nullopt;
  if (!v) {
    return InvalidArgument("hostlist '" + std::string(list) + "': '" + std::string(digits) +
                           "' is not a number");
  }
  return *v;
}

std::string Padded(std::int64_t v, std::size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// "01-04,07" -> 01 02 03 04 07.
Status ExpandRanges(std::string_view ranges, std::string_view list, std::vector<std::string>* out) {
  std::size_t start = 0;
  while (start <= ranges.size()) {
    const std::size_t comma = std::min(ranges.find(',', start), ranges.size());
    const std::string_view item = ranges.substr(start, comma - start);
    if (item.empty()) {
      return InvalidArgument("hostlist '" + std::string(list) + "': empty range in '[" +
                             std::string(ranges) + "]'");
    }
    const std::size_t dash = item.find('-');
    const std::string_view lo_text = item.substr(0, dash);
    const std::string_view hi_text =
        dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
    auto lo = Number(lo_text, list);
    CRUN_RETURN_IF_ERROR(lo.status());
    auto hi = Number(hi_text, list);
    CRUN_RETURN_IF_ERROR(hi.status());
    if (*hi < *lo) {
      return InvalidArgument("hostlist '" + std::string(list) + "': range '" + std::string(item) +
                             "' runs backwards");
    }
    if (static_cast<std::size_t>(*hi - *lo) >= kMaxHosts) {
      return InvalidArgument("hostlist '" + std::string(list) + "': range '" + std::string(item) +
                             "' has more than " + std::to_string(kMaxHosts) + " hosts");
    }
    // Slurm's rule: a leading zero fixes the width to the low bound's.
    const std::size_t width = lo_text.size() > 1 && lo_text[0] == '0' ? lo_text.size() : 0;
    for (std::int64_t v = *lo; v <= *hi; ++v) out->push_back(Padded(v, width));
    start = comma + 1;
  }
  return Status::Ok();
}

// One host expression (no top-level comma): text and bracket groups, expanded as a product.
Status ExpandOne(std::string_view expr, std::string_view list, std::vector<std::string>* out) {
  std::vector<std::string> partial = {""};
  std::size_t i = 0;
  while (i < expr.size()) {
    if (expr[i] == ']') {
      return InvalidArgument("hostlist '" + std::string(list) + "': ']' without '['");
    }
    if (expr[i] != '[') {
      const std::size_t next = std::min(expr.find_first_of("[]", i), expr.size());
      for (auto& p : partial) p.append(expr.substr(i, next - i));
      i = next;
      continue;
    }
    const std::size_t close = expr.find(']', i);
    if (close == std::string_view::npos) {
      return InvalidArgument("hostlist '" + std::string(list) + "': '[' without ']'");
    }
    const std::string_view ranges = expr.substr(i + 1, close - i - 1);
    if (ranges.find('[') != std::string_view::npos) {
      return InvalidArgument("hostlist '" + std::string(list) + "': nested '['");
    }
    std::vector<std::string> values;
    CRUN_RETURN_IF_ERROR(ExpandRanges(ranges, list, &values));
    if (partial.size() * values.size() > kMaxHosts) {
      return InvalidArgument("hostlist '" + std::string(list) + "' has more than " +
                             std::to_string(kMaxHosts) + " hosts");
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * values.size());
    for (const auto& p : partial) {
      for (const auto& v : values) next.push_back(p + v);
    }
    partial = std::move(next);
    i = close + 1;
  }
  for (auto& p : partial) out->push_back(std::move(p));
  return Status::Ok();
}

// The step's run id: the same for every node and task of the step, another for each step.
std::string RunId(const SlurmStep& step) { return "slurm-" + step.job_id + "." + step.step_id; }

// The first of `names` that is set, or null; `which` gets its name.
const char* First(const Getenv& getenv, std::initializer_list<const char*> names,
                  const char** which) {
  for (const char* n : names) {
    if (const char* v = Lookup(getenv, n)) {
      *which = n;
      return v;
    }
  }
  *which = *names.begin();
  return nullptr;
}

StatusOr<int> Int(const char* name, const char* value, int min) {
  const auto v = ParseInteger(value, min, std::numeric_limits<int>::max());
  if (!v) {
    return InvalidArgument(std::string(name) + "='" + value +
                           "' is not an integer >= " + std::to_string(min));
  }
  return static_cast<int>(*v);
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view list) {
  if (list.empty()) return InvalidArgument("hostlist is empty");
  std::vector<std::string> hosts;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (std::isspace(static_cast<unsigned char>(c))) {
      return InvalidArgument("hostlist '" + std::string(list) + "': contains white space");
    }
    // The end always closes the last expression: an unclosed '[' is reported by ExpandOne.
    if (i < list.size() && (c != ',' || depth > 0)) continue;
    const std::string_view expr = list.substr(start, i - start);
    if (expr.empty()) {
      return InvalidArgument("hostlist '" + std::string(list) + "': empty host name");
    }
    CRUN_RETURN_IF_ERROR(ExpandOne(expr, list, &hosts));
    if (hosts.size() > kMaxHosts) {
      return InvalidArgument("hostlist '" + std::string(list) + "' has more than " +
                             std::to_string(kMaxHosts) + " hosts");
    }
    start = i + 1;
  }
  return hosts;
}

StatusOr<std::vector<int>> ExpandTasksPerNode(std::string_view value) {
  std::vector<int> out;
  std::size_t start = 0;
  auto bad = [&] {
    return InvalidArgument("tasks per node '" + std::string(value) +
                           "': expected N or N(xK), comma-separated");
  };
  if (value.empty()) return bad();
  while (start <= value.size()) {
    const std::size_t comma = std::min(value.find(',', start), value.size());
    std::string item(value.substr(start, comma - start));
    int repeat = 1;
    if (const auto paren = item.find("(x"); paren != std::string::npos) {
      if (item.back() != ')') return bad();
      auto r = Int("repeat", item.substr(paren + 2, item.size() - paren - 3).c_str(), 1);
      if (!r.ok()) return bad();
      repeat = *r;
      item.resize(paren);
    }
    auto n = Int("tasks", item.c_str(), 1);
    if (!n.ok() || repeat > static_cast<int>(kMaxHosts) ||
        out.size() + static_cast<std::size_t>(repeat) > kMaxHosts) {
      return bad();
    }
    out.insert(out.end(), static_cast<std::size_t>(repeat), *n);
    start = comma + 1;
  }
  return out;
}

bool InSlurmStep(const Getenv& getenv) {
  return Lookup(getenv, "SLURM_JOB_ID") != nullptr && Lookup(getenv, "SLURM_STEP_ID") != nullptr;
}

StatusOr<SlurmStep> ReadSlurmStep(const Getenv& getenv) {
  SlurmStep step;
  const char* which = nullptr;
  const std::pair<const char*, std::string*> ids[] = {{"SLURM_JOB_ID", &step.job_id},
                                                      {"SLURM_STEP_ID", &step.step_id}};
  for (const auto& [name, field] : ids) {
    const char* v = Lookup(getenv, name);
    if (v == nullptr || *v == '\0') {
      return InvalidArgument(std::string(name) +
                             " is not set: not inside a Slurm job step "
                             "(start crun with srun)");
    }
    CRUN_RETURN_IF_ERROR(Int(name, v, 0).status());
    *field = v;
  }
  const char* list =
      First(getenv, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &which);
  if (list == nullptr) return InvalidArgument("SLURM_STEP_NODELIST is not set");
  auto nodes = ExpandHostlist(list);
  if (!nodes.ok()) return InvalidArgument(std::string(which) + ": " + nodes.status().message());
  step.nodes = std::move(nodes).value();
  if (const char* n = First(getenv, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}, &which)) {
    auto count = Int(which, n, 1);
    CRUN_RETURN_IF_ERROR(count.status());
    if (static_cast<std::size_t>(*count) != step.nodes.size()) {
      return InvalidArgument(std::string(which) + "=" + n + " but the node list '" + list +
                             "' has " + std::to_string(step.nodes.size()) + " nodes");
    }
  }
  const char* node_id = Lookup(getenv, "SLURM_NODEID");
  if (node_id == nullptr) return InvalidArgument("SLURM_NODEID is not set");
  auto nid = Int("SLURM_NODEID", node_id, 0);
  CRUN_RETURN_IF_ERROR(nid.status());
  if (static_cast<std::size_t>(*nid) >= step.nodes.size()) {
    return InvalidArgument(std::string("SLURM_NODEID=") + node_id + " is not below the " +
                           std::to_string(step.nodes.size()) + " nodes of '" + list + "'");
  }
  step.node_id = *nid;
  // Task-level variables: set by srun for every task; checked where they are used.
  const std::pair<const char*, int*> ints[] = {{"SLURM_PROCID", &step.proc_id},
                                               {"SLURM_LOCALID", &step.local_id}};
  for (const auto& [name, field] : ints) {
    if (const char* v = Lookup(getenv, name)) {
      auto x = Int(name, v, 0);
      CRUN_RETURN_IF_ERROR(x.status());
      *field = *x;
    }
  }
  if (const char* v = First(getenv, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, &which)) {
    auto x = Int(which, v, 1);
    CRUN_RETURN_IF_ERROR(x.status());
    step.ntasks = *x;
  }
  if (const char* v =
          First(getenv, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, &which)) {
    auto t = ExpandTasksPerNode(v);
    if (!t.ok()) return InvalidArgument(std::string(which) + ": " + t.status().message());
    step.tasks_per_node = std::move(t).value();
  }
  return step;
}

int SlurmDefaultPort(const SlurmStep& step) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  const auto job = static_cast<std::uint64_t>(ParseInteger(step.job_id, 0, kMax).value_or(0));
  const auto id = static_cast<std::uint64_t>(ParseInteger(step.step_id, 0, kMax).value_or(0));
  return 10000 + static_cast<int>((8 * job + id) % 22000);
}

SlurmNodeSettings NodeSettings(const SlurmStep& step, int port) {
  SlurmNodeSettings s;
  s.nnodes = static_cast<int>(step.nodes.size());
  s.node_rank = step.node_id;
  s.run_id = RunId(step);
  s.host = step.nodes.front();
  s.port = port;
  s.is_host = step.node_id == 0;
  s.node_name = step.nodes[static_cast<std::size_t>(step.node_id)];
  return s;
}

StatusOr<SlurmTaskSettings> TaskSettings(const SlurmStep& step, int port) {
  if (step.proc_id < 0) return InvalidArgument("SLURM_PROCID is not set (start crun with srun)");
  if (step.local_id < 0) return InvalidArgument("SLURM_LOCALID is not set");
  if (step.ntasks < 0) return InvalidArgument("SLURM_STEP_NUM_TASKS is not set");
  if (step.tasks_per_node.empty()) return InvalidArgument("SLURM_STEP_TASKS_PER_NODE is not set");
  if (step.tasks_per_node.size() != step.nodes.size()) {
    return InvalidArgument("SLURM_STEP_TASKS_PER_NODE names " +
                           std::to_string(step.tasks_per_node.size()) + " nodes, the node list " +
                           std::to_string(step.nodes.size()));
  }
  int total = 0;
  for (int t : step.tasks_per_node) total += t;
  if (total != step.ntasks) {
    return InvalidArgument("SLURM_STEP_TASKS_PER_NODE adds up to " + std::to_string(total) +
                           " tasks, SLURM_STEP_NUM_TASKS is " + std::to_string(step.ntasks));
  }
  const int here = step.tasks_per_node[static_cast<std::size_t>(step.node_id)];
  if (step.proc_id >= step.ntasks || step.local_id >= here) {
    return InvalidArgument("SLURM_PROCID=" + std::to_string(step.proc_id) +
                           ", SLURM_LOCALID=" + std::to_string(step.local_id) + " do not fit " +
                           std::to_string(step.ntasks) + " tasks, " + std::to_string(here) +
                           " on this node");
  }
  // Task 0 hosts the store at MASTER_ADDR, the step's first node: it must run there.
  if (step.proc_id == 0 && step.node_id != 0) {
    return InvalidArgument("task 0 runs on " + step.nodes[static_cast<std::size_t>(step.node_id)] +
                           ", not on the step's first node " + step.nodes.front() +
                           " (MASTER_ADDR); use srun's block or cyclic distribution");
  }
  SlurmTaskSettings s;
  s.rank = step.proc_id;
  s.local_rank = step.local_id;
  s.world_size = step.ntasks;
  s.local_world_size = here;
  s.group_rank = step.node_id;
  s.group_world_size = static_cast<int>(step.nodes.size());
  s.master_addr = step.nodes.front();
  s.master_port = port;
  s.run_id = RunId(step);
  return s;
}

}  // namespace crun::launcher
