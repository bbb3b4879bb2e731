#include "base/spelling.h"

#include <algorithm>

namespace crun {
namespace {

std::size_t Distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string ClosestName(std::string_view word, const std::vector<std::string>& known) {
  std::string best;
  std::size_t best_distance = 0;
  for (const auto& k : known) {
    const std::size_t d = Distance(word, k);
    if (best.empty() || d < best_distance) {
      best = k;
      best_distance = d;
    }
  }
  if (best.empty() || best_distance > std::max<std::size_t>(2, word.size() / 4)) return "";
  return best;
}

}  // namespace crun
