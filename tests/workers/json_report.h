// How the C++ test workers hand results to their Python suites: a JSON file, written under a
// temporary name and renamed, so a reader never sees half of it.
#pragma once

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

inline void WriteJsonReport(const std::string& path, const nlohmann::json& report) {
  std::ofstream(path + ".tmp") << report.dump() << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
}
