// A process environment as a map, read from this process and written for execve.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace crun {

using Environment = std::map<std::string, std::string>;

// This process's environment.
Environment CurrentEnvironment();

// "KEY=VALUE" strings for execve.
std::vector<std::string> ToEnvp(const Environment& env);

}  // namespace crun
