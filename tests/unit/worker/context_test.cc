// The worker SDK's reading of the environment contract: every required variable missing or
// malformed gives an error naming it, and what the agent writes reads back unchanged.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "agent/workers/worker_env.h"
#include "crun/worker/context.h"
#include "rendezvous/store/memory_store.h"

namespace {

using crun::worker::ReadWorkerEnv;
using Env = std::map<std::string, std::string>;

crun::worker::EnvLookup From(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

Env Valid() {
  return {{"RANK", "3"},
          {"LOCAL_RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"},
          {"GROUP_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.0.0.5"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_MAX_RESTARTS", "3"},
          {"TORCHELASTIC_RUN_ID", "job7"}};
}

}  // namespace

TEST_CASE("a complete environment reads back every field", "[worker]") {
  const Env env = Valid();
  auto e = ReadWorkerEnv(From(env));
  REQUIRE(e.ok());
  CHECK(e->rank == 3);
  CHECK(e->local_rank == 1);
  CHECK(e->world_size == 4);
  CHECK(e->local_world_size == 2);
  CHECK(e->group_rank == 1);
  CHECK(e->group_world_size == 2);
  CHECK(e->restart_count == 2);
  CHECK(e->max_restarts == 3);
  CHECK(e->run_id == "job7");
  CHECK(e->master_addr == "10.0.0.5");
  CHECK(e->master_port == 29500);
}

TEST_CASE("each required variable, when missing, is named", "[worker]") {
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                           "MASTER_ADDR", "MASTER_PORT"}) {
    Env env = Valid();
    env.erase(name);
    auto e = ReadWorkerEnv(From(env));
    INFO(name);
    REQUIRE_FALSE(e.ok());
    CHECK_THAT(e.status().message(),
               Catch::StartsWith(std::string(name) + " is not set: start this program with crun"));
  }
}

TEST_CASE("optional variables take their documented defaults", "[worker]") {
  Env env = Valid();
  for (const char* name : {"GROUP_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
                           "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID"}) {
    env.erase(name);
  }
  env["GROUP_RANK"] = "0";
  auto e = ReadWorkerEnv(From(env));
  REQUIRE(e.ok());
  CHECK(e->group_world_size == 1);
  CHECK(e->restart_count == 0);
  CHECK(e->max_restarts == 0);
  CHECK(e->run_id.empty());
}

TEST_CASE("malformed values are named with the value", "[worker]") {
  struct Row {
    const char* name;
    const char* value;
    const char* message;
  };
  const Row rows[] = {
      {"WORLD_SIZE", "two", "WORLD_SIZE='two' is not an integer"},
      {"WORLD_SIZE", "", "WORLD_SIZE='' is not an integer"},
      {"WORLD_SIZE", "0", "WORLD_SIZE=0 is out of range (1..2147483647)"},
      {"RANK", "-1", "RANK=-1 is out of range (0..2147483647)"},
      {"RANK", "4", "RANK=4 is not below WORLD_SIZE=4"},
      {"RANK", "3x", "RANK='3x' is not an integer"},
      {"LOCAL_RANK", "2", "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"},
      {"LOCAL_WORLD_SIZE", "5", "LOCAL_WORLD_SIZE=5 exceeds WORLD_SIZE=4"},
      {"GROUP_RANK", "2", "GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"},
      {"MASTER_PORT", "70000", "MASTER_PORT=70000 is out of range (1..65535)"},
      {"MASTER_PORT", "http", "MASTER_PORT='http' is not an integer"},
      {"MASTER_ADDR", "", "MASTER_ADDR is empty"},
      {"TORCHELASTIC_RESTART_COUNT", "x", "TORCHELASTIC_RESTART_COUNT='x' is not an integer"},
      {"WORLD_SIZE", "99999999999999999999", "WORLD_SIZE='99999999999999999999' is not an integer"},
  };
  for (const auto& row : rows) {
    Env env = Valid();
    env[row.name] = row.value;
    auto e = ReadWorkerEnv(From(env));
    INFO(row.name << "=" << row.value);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == crun::StatusCode::kInvalidArgument);
    CHECK_THAT(e.status().message(), Catch::StartsWith(row.message));
  }
}

TEST_CASE("what the agent writes, the SDK reads back unchanged", "[worker]") {
  crun::agent::GroupAssignment g;
  g.run_id = "job7";
  g.group_rank = 2;
  g.group_world_size = 3;
  g.local_world_size = 4;
  g.world_size = 11;
  g.base_rank = 7;
  g.master_addr = "10.1.2.3";
  g.master_port = 40123;
  g.restart_count = 1;
  g.max_restarts = 5;
  for (int local = 0; local < g.local_world_size; ++local) {
    const Env env = crun::agent::BuildWorkerEnvironment(g, local, "", "", {});
    auto e = ReadWorkerEnv(From(env));
    REQUIRE(e.ok());
    CHECK(e->rank == g.base_rank + local);
    CHECK(e->local_rank == local);
    CHECK(e->world_size == g.world_size);
    CHECK(e->local_world_size == g.local_world_size);
    CHECK(e->group_rank == g.group_rank);
    CHECK(e->group_world_size == g.group_world_size);
    CHECK(e->restart_count == g.restart_count);
    CHECK(e->max_restarts == g.max_restarts);
    CHECK(e->run_id == g.run_id);
    CHECK(e->master_addr == g.master_addr);
    CHECK(e->master_port == g.master_port);
  }
}

TEST_CASE("a context over a given store keys each round apart", "[worker]") {
  const Env env = Valid();
  auto e = ReadWorkerEnv(From(env));
  REQUIRE(e.ok());
  crun::worker::Context ctx(*e, std::make_shared<crun::MemoryStore>());
  CHECK(ctx.round_prefix() == "crun/worker/job7/2/");
  REQUIRE(ctx.store().Set(ctx.round_prefix() + "k", "v").ok());
  CHECK(*ctx.store().Get("crun/worker/job7/2/k") == "v");
}

TEST_CASE("an unreachable store is named with the rank", "[worker]") {
  Env env = Valid();
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = "1";  // nothing listens on port 1 here
  crun::worker::ContextOptions o;
  o.connect_timeout = std::chrono::milliseconds(200);
  auto ctx = crun::worker::Context::FromEnvironment(o, From(env));
  REQUIRE_FALSE(ctx.ok());
  CHECK_THAT(ctx.status().message(), Catch::StartsWith("rank 3: cannot use the job's store: ") &&
                                         Catch::Contains("127.0.0.1:1"));
}
