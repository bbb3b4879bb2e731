// The environment as the launcher's parsers read it: a function, so that tests (and a plan
// made for another machine) give a table instead of the process's own.
#pragma once

#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace crun::launcher {

using Getenv = std::function<const char*(const char*)>;

// getenv(name), or the process's environment when `getenv` is empty.
inline const char* Lookup(const Getenv& getenv, const char* name) {
  return getenv ? getenv(name) : std::getenv(name);
}

// The variable's value, or nothing when it is unset (set and empty is a value).
inline std::optional<std::string> EnvValue(const Getenv& getenv, const char* name) {
  const char* v = Lookup(getenv, name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// A fixed table as the environment.
inline Getenv FromTable(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

}  // namespace crun::launcher
