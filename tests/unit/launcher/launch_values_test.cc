// ParseLaunchValues: every text option parsed once into what it means, PET_* variables merged
// by the command line and torchrun's stand-in variables read where no flag is given; each
// refusal names the flag (or variable) and the value. Nothing here asks the machine.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <cctype>
#include <csignal>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launcher/launch_values.h"
#include "tests/unit/launcher/command_line.h"

namespace {

using namespace crun::launcher;
using Strings = std::vector<std::string>;
using Vars = std::map<std::string, std::string>;

crun::StatusOr<LaunchValues> Values(const Strings& args, const Vars& vars = {}) {
  Strings words = args;
  words.insert(words.end(), {"--no-python", "/bin/true"});
  const auto c = testing::ParseCommandLine(words);
  return ParseLaunchValues(c.o, c.given, FromTable(vars), {"etcd_user"});
}

std::string Refusal(const Strings& args, const Vars& vars = {}) {
  const auto v = Values(args, vars);
  return v.ok() ? "(accepted)" : v.status().message();
}

}  // namespace

TEST_CASE("values: the defaults, parsed", "[values]") {
  const auto v = Values({});
  REQUIRE(v.ok());
  CHECK(v->settings.min_nodes == 1);
  CHECK(v->settings.max_nodes == 1);
  CHECK(v->settings.max_restarts == 0);
  CHECK(v->master_port == -1);
  CHECK(v->shutdown_timeout == std::chrono::seconds(30));
  CHECK(v->hang_timeout == std::chrono::milliseconds(0));
  CHECK(v->settings.max_restarts_without_progress == 3);
  CHECK(v->progress_after == std::chrono::seconds(300));
  CHECK(v->signals == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(v->redirects.For(2) == std::vector<int>{0, 0});
  CHECK_FALSE(v->torchelastic_events);
  CHECK_FALSE(v->prefix_template.has_value());
  CHECK_FALSE(v->numa.has_value());
  CHECK(v->settings.contracts.ToString() == "torch");  // torch always, nothing more
}

TEST_CASE("values: flags, PET_* and torchrun's variables, each once", "[values]") {
  ::setenv("PET_MAX_RESTARTS", "4", 1);
  ::setenv("PET_HANG_TIMEOUT", "2.5", 1);
  ::setenv("PET_MAX_RESTARTS_WITHOUT_PROGRESS", "0", 1);
  const auto v = Values({"--nnodes",
                         "2:4",
                         "--master-port",
                         "29500",
                         "--tee",
                         "0:3",
                         "--local-ranks-filter",
                         "0,3",
                         "--event-log-handler",
                         "console",
                         "--rdzv-conf",
                         "join_timeout=9,etcd_user=me",
                         "--contract",
                         "tf,jax",
                         "--warm",
                         "--warm-modules",
                         "numpy",
                         "--numa-binding",
                         "node",
                         "--progress_after",
                         "90.5"},
                        {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"},
                         {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${rank}| "}});
  ::unsetenv("PET_MAX_RESTARTS");
  ::unsetenv("PET_HANG_TIMEOUT");
  ::unsetenv("PET_MAX_RESTARTS_WITHOUT_PROGRESS");
  REQUIRE(v.ok());
  CHECK(v->settings.max_restarts_without_progress == 0);
  CHECK(v->progress_after == std::chrono::milliseconds(90'500));
  CHECK(v->settings.max_nodes == 4);
  CHECK(v->settings.max_restarts == 4);
  CHECK(v->hang_timeout == std::chrono::milliseconds(2500));
  CHECK(v->master_port == 29500);
  CHECK(v->shutdown_timeout == std::chrono::seconds(7));
  CHECK(v->tee.For(2) == std::vector<int>{3, 0});
  CHECK(v->console_ranks == std::vector<int>{0, 3});  // 3: the plan checks it against nproc
  CHECK(v->torchelastic_events);
  CHECK(v->prefix_template == "${rank}| ");
  CHECK(v->rdzv_conf.join_timeout == 9);
  CHECK(v->rdzv_conf.backend_keys.at("etcd_user") == "me");  // a backend's key, as text
  CHECK(v->settings.contracts.Has(crun::Contract::kTensorflow));
  CHECK(v->settings.contracts.Has(crun::Contract::kJax));
  CHECK(v->warm_modules == Strings{"numpy"});
  CHECK(v->numa == NumaMode::kNode);
  // A flag wins over torchrun's variable; an empty variable is no value.
  const auto flag = Values({"--shutdown-timeout", "1", "--log-line-prefix-template", "> "},
                           {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"},
                            {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "x"}});
  REQUIRE(flag.ok());
  CHECK(flag->shutdown_timeout == std::chrono::seconds(1));
  CHECK(flag->prefix_template == "> ");
  CHECK_FALSE(Values({}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", ""}})->prefix_template);
}

TEST_CASE("values: refusals name the flag or variable and the value", "[values]") {
  struct Row {
    Strings args;
    Vars vars;
    std::string message;
  };
  for (const Row& row : {
           Row{{"--nnodes", "0"}, {}, "--nnodes '0'"},
           Row{{"--master-port", "70000"}, {}, "--master-port '70000'"},
           Row{{"--hang-timeout", "soon"}, {}, "--hang-timeout 'soon'"},
           Row{{"--max-restarts-without-progress", "-1"},
               {},
               "--max-restarts-without-progress '-1'"},
           Row{{"--progress-after", "later"}, {}, "--progress-after 'later'"},
           Row{{},
               {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "-1"}},
               "TORCH_ELASTIC_SHUTDOWN_TIMEOUT '-1'"},
           Row{{"--warm-modules", "numpy"}, {}, "--warm-modules needs --warm"},
           Row{{"--warm", "--warm-modules", "1x"}, {}, "--warm-modules: '1x' is not a Python"},
           Row{{"--redirects", "9"}, {}, "--redirects '9'"},
           Row{{"--local-ranks-filter", "x"}, {}, "--local-ranks-filter: 'x' is not a local rank"},
           Row{{"--signals-to-handle", "SIGNOPE"}, {}, "'SIGNOPE' is not a signal"},
           Row{{"--rdzv-conf", "join_timeout"}, {}, "--rdzv-conf: 'join_timeout' is not key=value"},
           Row{{"--contract", "ray"}, {}, "ray"},
           Row{{"--numa-binding", "far"}, {}, "far"},
           Row{{"--monitor-interval", "x"}, {}, "--monitor-interval 'x'"},
           Row{{"--straggler-action", "wran"},
               {},
               "--straggler-action 'wran': expected warn, restart, exclude or off (did you mean "
               "warn?)"},
       }) {
    INFO(Catch::Detail::stringify(row.args));
    CHECK_THAT(Refusal(row.args, row.vars), Catch::Contains(row.message));
  }
}

TEST_CASE("values: every --straggler-action, from the flag and from PET_STRAGGLER_ACTION",
          "[values]") {
  using crun::agent::StragglerAction;
  for (const auto& [word, action] :
       std::vector<std::pair<std::string, StragglerAction>>{{"off", StragglerAction::kOff},
                                                            {"warn", StragglerAction::kWarn},
                                                            {"restart", StragglerAction::kRestart},
                                                            {"exclude",
                                                             StragglerAction::kExclude}}) {
    INFO(word);
    const auto flag = Values({"--straggler-action", word});
    REQUIRE(flag.ok());
    CHECK(flag->straggler_action == action);
    ::setenv("PET_STRAGGLER_ACTION", word.c_str(), 1);
    const auto var = Values({});
    ::unsetenv("PET_STRAGGLER_ACTION");
    REQUIRE(var.ok());
    CHECK(var->straggler_action == action);
  }
  CHECK(Values({})->straggler_action == StragglerAction::kWarn);
}

TEST_CASE("values: every job setting with a flag of its own, from the one list", "[values]") {
  int checked = 0;
  for (const auto& f : crun::rdzv::SettingFields()) {
    if (f.flags == nullptr) continue;
    INFO(f.name);
    ++checked;
    const std::string all = f.flags;
    const std::string dashed = all.substr(0, all.find(','));
    const std::string underscored = all.substr(all.find(',') + 1);
    CHECK(underscored.find('_') != std::string::npos);  // torchrun's spelling too
    const auto v = Values({dashed, std::to_string(f.min + 1)});
    REQUIRE(v.ok());
    CHECK(f.get(v->settings) == f.min + 1);
    const auto u = Values({underscored, std::to_string(f.max)});
    REQUIRE(u.ok());
    CHECK(f.get(u->settings) == f.max);
    std::string env = "PET_" + std::string(f.name);
    for (auto& ch : env) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    ::setenv(env.c_str(), std::to_string(f.min + 2).c_str(), 1);
    const auto e = Values({});
    ::unsetenv(env.c_str());
    REQUIRE(e.ok());
    CHECK(f.get(e->settings) == f.min + 2);
    CHECK(Refusal({dashed, std::to_string(f.max + 1)}) ==
          dashed + " '" + std::to_string(f.max + 1) + "': expected a whole number from " +
              std::to_string(f.min) + " to " + std::to_string(f.max));
    CHECK(f.get(Values({})->settings) == f.get(crun::rdzv::Settings{}));  // absent: its default
  }
  CHECK(checked >= 2);
}
