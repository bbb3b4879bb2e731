#include "launcher/horovodrun_spelling.h"

#include <algorithm>
#include <sstream>

#include "base/numbers.h"

namespace crun::launcher {
namespace {

constexpr int kMaxSlots = 4'096;  // as --nproc-per-node allows

std::string Suggestion(const std::vector<std::pair<std::string, int>>& hosts) {
  int slots = 0;
  for (const auto& h : hosts) slots = std::max(slots, h.second);
  return "crun does not start processes on other hosts (it does not ssh): run on each node "
         "`crun --contract horovod --nnodes " +
         std::to_string(hosts.size()) + " --nproc-per-node " + std::to_string(slots) +
         " --rdzv-endpoint " + hosts.front().first +
         ":29400 train.py`, or one srun line under Slurm (docs/frameworks.md)";
}

}  // namespace

StatusOr<std::vector<std::string>> RewriteHorovodrunSpelling(
    std::vector<std::string> args, const std::function<bool(const std::string&)>& names_this_host) {
  std::string np, hosts_text;
  std::size_t i = 0;
  while (i < args.size() && (args[i] == "-np" || args[i] == "-H")) {
    if (i + 1 >= args.size()) return InvalidArgument(args[i] + " needs a value");
    (args[i] == "-np" ? np : hosts_text) = args[i + 1];
    i += 2;
  }
  if (i == 0) return args;
  if (i == args.size()) return InvalidArgument("-np/-H: no program to run after them");
  // -H host[:slots][,host[:slots]...]; horovodrun's default is localhost:<np>.
  std::vector<std::pair<std::string, int>> hosts;
  if (!hosts_text.empty()) {
    std::stringstream in(hosts_text);
    std::string item;
    while (std::getline(in, item, ',')) {
      const auto colon = item.rfind(':');
      const std::string host = item.substr(0, colon);
      int slots = 1;
      if (colon != std::string::npos) {
        const auto n = ParseInteger(item.substr(colon + 1), 1, kMaxSlots);
        if (!n) {
          return InvalidArgument("-H '" + hosts_text + "': '" + item +
                                 "' is not host:slots (slots 1 to 4096)");
        }
        slots = static_cast<int>(*n);
      }
      if (host.empty()) return InvalidArgument("-H '" + hosts_text + "': a host is empty");
      hosts.emplace_back(host, slots);
    }
    if (hosts.empty()) return InvalidArgument("-H '' names no host");
  }
  int slots = 0;
  for (const auto& [host, n] : hosts) {
    if (!names_this_host(host)) {
      return InvalidArgument("-H '" + hosts_text + "' names " + host +
                             ", which is not this host: " + Suggestion(hosts));
    }
    slots += n;
  }
  int nproc = slots;
  if (!np.empty()) {
    const auto n = ParseInteger(np, 1, kMaxSlots);
    if (!n) return InvalidArgument("-np '" + np + "' is not a whole number from 1 to 4096");
    nproc = static_cast<int>(*n);
    if (!hosts.empty() && nproc > slots) {
      return InvalidArgument("-np " + np + " is more than the " + std::to_string(slots) +
                             " slots of -H " + hosts_text);
    }
  }
  // horovodrun runs a whole command (`python train.py`), not a script.
  std::vector<std::string> out{"--contract", "horovod", "--nproc-per-node", std::to_string(nproc),
                               "--no-python"};
  out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
}

}  // namespace crun::launcher
