// "Did you mean": the known name a mistyped word is closest to, for errors that name both.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace crun {

// The name of `known` fewest edits (insertions, deletions, substitutions) away from `word`,
// if it is close enough to be a typo: at most max(2, word's length / 4) edits. Else empty.
std::string ClosestName(std::string_view word, const std::vector<std::string>& known);

}  // namespace crun
