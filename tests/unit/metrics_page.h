// Reading a Prometheus text page in tests: the value of one series, named as it is written
// ("crun_rendezvous_rounds_total{run_id=\"job7\"}").
#pragma once

#include <optional>
#include <sstream>
#include <string>

namespace crun::testing {

inline std::optional<double> SampleValue(const std::string& page, const std::string& series) {
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return std::nullopt;
}

}  // namespace crun::testing
