// The launcher's command line, as RunLaunch parses it: `words` (options, then the worker's
// command) in, the options as given and which flags were given out. For the plan's tests.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "launcher/launch_plan.h"

namespace crun::launcher::testing {

struct CommandLine {
  LaunchOptions o;
  std::set<std::string> given;
};

inline CommandLine ParseCommandLine(const std::vector<std::string>& words) {
  CLI::App app;
  app.prefix_command();
  CommandLine c;
  AddLaunchOptions(app, c.o);
  std::vector<std::string> reversed(words.rbegin(), words.rend());  // CLI11's order
  app.parse(reversed);
  c.o.command = app.remaining();
  c.given = GivenFlags(app);
  return c;
}

}  // namespace crun::launcher::testing
