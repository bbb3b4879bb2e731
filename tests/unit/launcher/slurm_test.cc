// Slurm's hostlist expressions and job-step variables, turned into crun's settings for one crun
// per node and one crun per worker (launcher/slurm.h).
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "launcher/slurm.h"

namespace {

using crun::launcher::ExpandHostlist;
using crun::launcher::ExpandTasksPerNode;
using Strings = std::vector<std::string>;

crun::launcher::Getenv From(const std::map<std::string, std::string>& vars) {
  return crun::launcher::FromTable(vars);
}

// What srun sets for a task of `srun -N3 --ntasks-per-node=2` on node[07-09], job 4242 step 3.
std::map<std::string, std::string> StepVars(int node, int proc, int local) {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "3"},
          {"SLURM_STEP_NODELIST", "node[07-09]"},
          {"SLURM_STEP_NUM_NODES", "3"},
          {"SLURM_NODEID", std::to_string(node)},
          {"SLURM_PROCID", std::to_string(proc)},
          {"SLURM_LOCALID", std::to_string(local)},
          {"SLURM_STEP_NUM_TASKS", "6"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x3)"}};
}

}  // namespace

TEST_CASE("hostlists expand as Slurm expands them", "[slurm]") {
  CHECK(*ExpandHostlist("node1") == Strings{"node1"});
  CHECK(*ExpandHostlist("node[01-04,07]") ==
        Strings{"node01", "node02", "node03", "node04", "node07"});
  CHECK(*ExpandHostlist("gpu-a[1-2]-ib,cpu7") == Strings{"gpu-a1-ib", "gpu-a2-ib", "cpu7"});
  CHECK(*ExpandHostlist("r[1-2]-n[08-10]") ==
        Strings{"r1-n08", "r1-n09", "r1-n10", "r2-n08", "r2-n09", "r2-n10"});
  CHECK(*ExpandHostlist("a[9-11],b[0],c") == Strings{"a9", "a10", "a11", "b0", "c"});
  CHECK(*ExpandHostlist("x[098-101]") == Strings{"x098", "x099", "x100", "x101"});
  CHECK(*ExpandHostlist("10.0.0.[1-2]") == Strings{"10.0.0.1", "10.0.0.2"});
  CHECK(ExpandHostlist("n[0-1023]")->size() == 1024);
}

TEST_CASE("a malformed hostlist is an error naming it and the fault", "[slurm]") {
  const std::pair<const char*, const char*> bad[] = {
      {"", "empty"},
      {"node[1-3", "'[' without ']'"},
      {"node1-3]", "']' without '['"},
      {"node[3-1]", "runs backwards"},
      {"node[a-b]", "'a' is not a number"},
      {"node[1,,2]", "empty range"},
      {"node[]", "empty range"},
      {"a,,b", "empty host name"},
      {"a,", "empty host name"},
      {"node[1-[2]]", "nested"},
      {"node 1", "white space"},
      {"n[0-99999999]", "more than"},
      {"n[0-9999]-m[0-9999]", "more than"},
  };
  for (const auto& [list, why] : bad) {
    INFO(list);
    auto r = ExpandHostlist(list);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == crun::StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(why));
    if (*list != '\0')
      CHECK_THAT(r.status().message(), Catch::Contains(std::string("'") + list + "'"));
  }
}

TEST_CASE("tasks per node expand, repeats included", "[slurm]") {
  CHECK(*ExpandTasksPerNode("4") == std::vector<int>{4});
  CHECK(*ExpandTasksPerNode("4(x2),3") == std::vector<int>{4, 4, 3});
  CHECK(*ExpandTasksPerNode("1,2(x1),3") == std::vector<int>{1, 2, 3});
  for (const char* bad : {"", "x", "4(x)", "4(x2", "0", "4(x0)", "4,,3", "-1"}) {
    INFO(bad);
    auto r = ExpandTasksPerNode(bad);
    CHECK_FALSE(r.ok());
  }
}

TEST_CASE("one crun per node: node rank in Slurm's order, rendezvous on the first node",
          "[slurm]") {
  for (int node = 0; node < 3; ++node) {
    auto step = crun::launcher::ReadSlurmStep(From(StepVars(node, 2 * node, 0)));
    REQUIRE(step.ok());
    const int port = crun::launcher::SlurmDefaultPort(*step);
    auto s = crun::launcher::NodeSettings(*step, port);
    CHECK(s.nnodes == 3);
    CHECK(s.node_rank == node);
    CHECK(s.host == "node07");
    CHECK(s.is_host == (node == 0));
    CHECK(s.node_name == "node0" + std::to_string(7 + node));
    CHECK(s.run_id == "slurm-4242.3");
    CHECK(s.port == 10000 + (8 * 4242 + 3) % 22000);
  }
}

TEST_CASE("the default port is the step's: the same on every node, another for each step",
          "[slurm]") {
  auto vars = StepVars(0, 0, 0);
  const int a = crun::launcher::SlurmDefaultPort(*crun::launcher::ReadSlurmStep(From(vars)));
  vars["SLURM_NODEID"] = "2";
  CHECK(crun::launcher::SlurmDefaultPort(*crun::launcher::ReadSlurmStep(From(vars))) == a);
  vars["SLURM_STEP_ID"] = "4";
  const int b = crun::launcher::SlurmDefaultPort(*crun::launcher::ReadSlurmStep(From(vars)));
  CHECK(b != a);
  CHECK(a >= 10000);
  CHECK(a < 32000);
}

TEST_CASE("one crun per worker: the torchrun environment of each task", "[slurm]") {
  // Block distribution: tasks 0-1 on node07, 2-3 on node08, 4-5 on node09.
  for (int proc = 0; proc < 6; ++proc) {
    auto step = crun::launcher::ReadSlurmStep(From(StepVars(proc / 2, proc, proc % 2)));
    REQUIRE(step.ok());
    auto t = crun::launcher::TaskSettings(*step, 12345);
    INFO(t.status().message());
    REQUIRE(t.ok());
    CHECK(t->rank == proc);
    CHECK(t->local_rank == proc % 2);
    CHECK(t->world_size == 6);
    CHECK(t->local_world_size == 2);
    CHECK(t->group_rank == proc / 2);
    CHECK(t->group_world_size == 3);
    CHECK(t->master_addr == "node07");
    CHECK(t->master_port == 12345);
    CHECK(t->run_id == "slurm-4242.3");
  }
}

TEST_CASE("uneven tasks per node give each node its own local world size", "[slurm]") {
  auto vars = StepVars(1, 2, 0);
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2,1(x2)";
  vars["SLURM_STEP_NUM_TASKS"] = "4";
  auto t = crun::launcher::TaskSettings(*crun::launcher::ReadSlurmStep(From(vars)), 1);
  REQUIRE(t.ok());
  CHECK(t->local_world_size == 1);
  CHECK(t->world_size == 4);
}

TEST_CASE("bad or missing Slurm variables are named with their values", "[slurm]") {
  struct Case {
    int node;                                   // SLURM_NODEID of the task (its PROCID is 0)
    std::map<std::string, std::string> change;  // "" removes the variable
    std::string text;
  };
  const Case cases[] = {
      {0, {{"SLURM_JOB_ID", ""}}, "SLURM_JOB_ID is not set"},
      {0, {{"SLURM_STEP_NODELIST", "node[07-09"}}, "SLURM_STEP_NODELIST: hostlist 'node[07-09'"},
      {0,
       {{"SLURM_STEP_NUM_NODES", "4"}},
       "SLURM_STEP_NUM_NODES=4 but the node list 'node[07-09]' has 3 nodes"},
      {0, {{"SLURM_NODEID", "3"}}, "SLURM_NODEID=3 is not below the 3 nodes"},
      {0, {{"SLURM_NODEID", "one"}}, "SLURM_NODEID='one' is not an integer"},
      {0, {{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}}, "names 2 nodes, the node list 3"},
      {0, {{"SLURM_STEP_NUM_TASKS", "5"}}, "adds up to 6 tasks, SLURM_STEP_NUM_TASKS is 5"},
      {1, {}, "task 0 runs on node08, not on the step's first node node07"},
      {0, {{"SLURM_PROCID", ""}}, "SLURM_PROCID is not set"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    auto vars = StepVars(c.node, 0, 0);
    for (const auto& [name, value] : c.change) {
      if (value.empty()) {
        vars.erase(name);
      } else {
        vars[name] = value;
      }
    }
    auto step = crun::launcher::ReadSlurmStep(From(vars));
    crun::Status s = step.status();
    if (step.ok()) s = crun::launcher::TaskSettings(*step, 1).status();
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains(c.text));
  }
}

TEST_CASE("the job's node list stands in when the step's is not set", "[slurm]") {
  auto v = StepVars(0, 0, 0);
  v.erase("SLURM_STEP_NODELIST");
  v["SLURM_JOB_NODELIST"] = "gpu[1-3]";
  auto step = crun::launcher::ReadSlurmStep(From(v));
  REQUIRE(step.ok());
  CHECK(step->nodes == Strings{"gpu1", "gpu2", "gpu3"});
  CHECK(crun::launcher::InSlurmStep(From(v)));
  CHECK_FALSE(crun::launcher::InSlurmStep(From({})));
}
