// The other frameworks' contracts (agent/frameworks/contracts.h) as tables: names in, variables
// out.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>

#include <nlohmann/json.hpp>

#include "agent/frameworks/contracts.h"

using crun::Environment;
using crun::agent::Contract;
using crun::agent::ContractSet;
using crun::agent::GroupAssignment;
using crun::agent::RoundMember;

namespace {

ContractSet Parse(const std::string& list) {
  auto s = crun::agent::ParseContracts(list);
  REQUIRE(s.ok());
  return *s;
}

// Two nodes: "alpha" with 2 workers, "beta" with 3, as the service would give node `rank`.
GroupAssignment TwoNodes(const ContractSet& c, int group_rank) {
  GroupAssignment g;
  g.group_rank = group_rank;
  g.group_world_size = 2;
  g.local_world_size = group_rank == 0 ? 2 : 3;
  g.world_size = 5;
  g.base_rank = group_rank == 0 ? 0 : 2;
  auto ports = [&c](int nproc, std::uint16_t first) {
    std::vector<std::uint16_t> p;
    for (int i = 0; i < crun::PortLayout(c, nproc).count(); ++i) p.push_back(first + i);
    return p;
  };
  g.members = {RoundMember{"alpha", "10.0.0.1", 2, ports(2, 4000)},
               RoundMember{"beta", "fd00::2", 3, ports(3, 5000)}};
  return g;
}

Environment For(const ContractSet& c, const GroupAssignment& g, int local_rank) {
  Environment env{{"RANK", std::to_string(g.base_rank + local_rank)}};
  const crun::Status s = crun::agent::AddContractEnvironment(c, g, local_rank, env);
  REQUIRE(s.ok());
  return env;
}

}  // namespace

TEST_CASE("contracts: names, the tf alias, and torch always in", "[contracts]") {
  const struct {
    const char* list;
    const char* canonical;
  } cases[] = {
      {"torch", "torch"},
      {"tensorflow", "torch,tensorflow"},
      {"tf", "torch,tensorflow"},
      {"jax,tf", "torch,tensorflow,jax"},
      {"mpi,deepspeed,horovod,jax,tensorflow,torch", "torch,tensorflow,jax,horovod,deepspeed,mpi"},
      {"jax,jax", "torch,jax"},
  };
  for (const auto& c : cases) {
    INFO(c.list);
    CHECK(Parse(c.list).ToString() == c.canonical);
  }
  CHECK(ContractSet{}.ToString() == "torch");
}

TEST_CASE("contracts: an unknown name is refused with the closest one", "[contracts]") {
  const struct {
    const char* list;
    const char* message;
  } cases[] = {
      {"tensorflw",
       "unknown contract 'tensorflw' (did you mean tensorflow?); known: torch, "
       "tensorflow (tf), jax, horovod, deepspeed, mpi"},
      {"jax,horovd", "unknown contract 'horovd' (did you mean horovod?)"},
      {"Deepspeed", "unknown contract 'Deepspeed' (did you mean deepspeed?)"},
      {"mxnet", "unknown contract 'mxnet'; known:"},
      {"", "--contract '' names no contract"},
      {"jax,", "--contract 'jax,' names no contract"},
      {",jax", "unknown contract ''"},
  };
  for (const auto& c : cases) {
    INFO(c.list);
    auto s = crun::agent::ParseContracts(c.list);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().message().find(c.message) == 0);
  }
}

TEST_CASE("contracts: ports to reserve per node", "[contracts]") {
  using crun::PortLayout;
  CHECK(PortLayout(Parse("torch"), 4).count() == 0);
  CHECK(PortLayout(Parse("tensorflow"), 4).count() == 4);
  CHECK(PortLayout(Parse("jax"), 4).count() == 1);
  CHECK(PortLayout(Parse("tf,jax"), 4).count() == 5);
  CHECK(PortLayout(Parse("horovod"), 4).count() == 1);
  CHECK(PortLayout(Parse("tf,jax,horovod"), 4).count() == 6);
  CHECK(PortLayout(Parse("tf,jax,horovod"), 4).Port(crun::Contract::kJax) == 4u);
  CHECK(PortLayout(Parse("tf,jax,horovod"), 4).Port(crun::Contract::kHorovod) == 5u);
  CHECK(PortLayout(Parse("jax,horovod"), 4).Port(crun::Contract::kHorovod) == 1u);
  CHECK_FALSE(PortLayout(Parse("jax,horovod"), 4).Port(crun::Contract::kTensorflow, 0));
  CHECK(PortLayout(Parse("deepspeed,mpi"), 4).count() == 0);
  CHECK_FALSE(Parse("deepspeed,mpi").NeedsPorts());
  CHECK(Parse("horovod").NeedsPorts());
}

// Every contract set with every worker count: the layout's indexes are each one port of the
// node's, none twice, and a node's port list is accepted exactly when it has count() ports.
TEST_CASE("contracts: the port layout of every set and worker count", "[contracts]") {
  const std::vector<std::string> names = {"tensorflow", "jax", "horovod", "deepspeed", "mpi"};
  for (unsigned mask = 0; mask < (1u << names.size()); ++mask) {
    std::string list = "torch";
    for (std::size_t i = 0; i < names.size(); ++i) {
      if ((mask & (1u << i)) != 0) list += "," + names[i];
    }
    const ContractSet c = Parse(list.c_str());
    for (int nproc = 1; nproc <= 8; ++nproc) {
      INFO(list << " with " << nproc << " workers");
      const crun::PortLayout layout(c, nproc);
      std::vector<int> used(static_cast<std::size_t>(layout.count()), 0);
      const auto use = [&](std::optional<std::size_t> i) {
        if (!i) return;
        REQUIRE(*i < used.size());
        ++used[*i];
      };
      for (int lr = 0; lr < nproc; ++lr) {
        CHECK(layout.Port(Contract::kTensorflow, lr).has_value() == c.Has(Contract::kTensorflow));
        use(layout.Port(Contract::kTensorflow, lr));
      }
      CHECK(layout.Port(crun::Contract::kJax).has_value() == c.Has(Contract::kJax));
      CHECK(layout.Port(crun::Contract::kHorovod).has_value() == c.Has(Contract::kHorovod));
      use(layout.Port(crun::Contract::kJax));
      use(layout.Port(crun::Contract::kHorovod));
      CHECK(std::all_of(used.begin(), used.end(), [](int n) { return n == 1; }));
      CHECK((layout.count() > 0) == c.NeedsPorts());
      const auto n = static_cast<std::size_t>(layout.count());
      CHECK(layout.Check(n).ok());
      CHECK_FALSE(layout.Check(n + 1).ok());
      if (n > 0) CHECK_FALSE(layout.Check(n - 1).ok());
    }
  }
}

TEST_CASE("contracts: the wire form keeps the set, and bits it does not know", "[contracts]") {
  for (const char* list : {"torch", "tf,jax", "jax,horovod,mpi", "deepspeed"}) {
    const ContractSet c = Parse(list);
    CHECK(ContractSet::FromBits(c.bits()) == c);
    CHECK(ContractSet::FromBits(c.bits()).Known());
  }
  CHECK(ContractSet::FromBits(0) == Parse("torch"));  // an agent that predates the field
  const ContractSet newer = ContractSet::FromBits(1u << 20);
  CHECK_FALSE(newer.Known());
  CHECK_THAT(newer.ToString(), Catch::Contains("unknown contracts"));
}

TEST_CASE("contracts: TF_CONFIG lists every worker in global rank order", "[contracts]") {
  const ContractSet c = Parse("tensorflow");
  const std::vector<std::string> cluster{"10.0.0.1:4000", "10.0.0.1:4001", "[fd00::2]:5000",
                                         "[fd00::2]:5001", "[fd00::2]:5002"};
  for (const auto& [node, lr, rank] : {std::tuple{0, 0, 0}, {0, 1, 1}, {1, 0, 2}, {1, 2, 4}}) {
    INFO("rank " << rank);
    const auto env = For(c, TwoNodes(c, node), lr);
    const auto tf = nlohmann::json::parse(env.at("TF_CONFIG"));
    CHECK(tf["cluster"]["worker"].get<std::vector<std::string>>() == cluster);
    CHECK(tf["cluster"].size() == 1);
    CHECK(tf["task"] == nlohmann::json{{"type", "worker"}, {"index", rank}});
    CHECK_FALSE(env.contains("JAX_COORDINATOR_ADDRESS"));
  }
}

TEST_CASE("contracts: JAX's coordinator is node 0's last reserved port", "[contracts]") {
  for (const char* list : {"jax", "tf,jax"}) {
    const ContractSet c = Parse(list);
    const std::string want =
        std::string("10.0.0.1:") + (c.Has(Contract::kTensorflow) ? "4002" : "4000");
    for (int node : {0, 1}) {
      INFO(list << " node " << node);
      const auto env = For(c, TwoNodes(c, node), 0);
      CHECK(env.at("JAX_COORDINATOR_ADDRESS") == want);
      CHECK(env.at("JAX_ENABLE_PREEMPTION_SERVICE") == "false");
    }
  }
  // A user who wants SIGTERM as a preemption notice keeps it.
  const ContractSet c = Parse("jax");
  Environment env{{"JAX_ENABLE_PREEMPTION_SERVICE", "true"}};
  REQUIRE(crun::agent::AddContractEnvironment(c, TwoNodes(c, 0), 0, env).ok());
  CHECK(env.at("JAX_ENABLE_PREEMPTION_SERVICE") == "true");
}

TEST_CASE("contracts: Horovod's ranks, cross ranks on uneven nodes, and host names",
          "[contracts]") {
  const ContractSet c = Parse("horovod");
  const struct {
    int node, local_rank;
    const char *rank, *local_size, *cross_rank, *cross_size, *host;
  } cases[] = {
      {0, 0, "0", "2", "0", "2", "alpha"}, {0, 1, "1", "2", "0", "2", "alpha"},
      {1, 0, "2", "3", "1", "2", "beta"},  {1, 1, "3", "3", "1", "2", "beta"},
      {1, 2, "4", "3", "0", "1", "beta"},  // only beta has a local rank 2
  };
  for (const auto& k : cases) {
    INFO("node " << k.node << " local rank " << k.local_rank);
    const auto env = For(c, TwoNodes(c, k.node), k.local_rank);
    CHECK(env.at("HOROVOD_RANK") == k.rank);
    CHECK(env.at("HOROVOD_SIZE") == "5");
    CHECK(env.at("HOROVOD_LOCAL_RANK") == std::to_string(k.local_rank));
    CHECK(env.at("HOROVOD_LOCAL_SIZE") == k.local_size);
    CHECK(env.at("HOROVOD_CROSS_RANK") == k.cross_rank);
    CHECK(env.at("HOROVOD_CROSS_SIZE") == k.cross_size);
    CHECK(env.at("HOROVOD_HOSTNAME") == k.host);
    CHECK(env.at("HOROVOD_CONTROLLER") == "gloo");
    CHECK(env.at("HOROVOD_CPU_OPERATIONS") == "gloo");
    // Node 0's crun serves the rendezvous on its reserved port.
    CHECK(env.at("HOROVOD_GLOO_RENDEZVOUS_ADDR") == "10.0.0.1");
    CHECK(env.at("HOROVOD_GLOO_RENDEZVOUS_PORT") == "4000");
  }
  const ContractSet all = Parse("tf,jax,horovod");
  CHECK(For(all, TwoNodes(all, 1), 0).at("HOROVOD_GLOO_RENDEZVOUS_PORT") == "4003");
  // Two agents on one host keep separate local scopes.
  GroupAssignment g = TwoNodes(c, 1);
  g.members[0].host = g.members[1].host = "box";
  CHECK(For(c, g, 0).at("HOROVOD_HOSTNAME") == "box-node1");
  g.group_rank = 0;
  CHECK(For(c, g, 0).at("HOROVOD_HOSTNAME") == "box-node0");
}

TEST_CASE("contracts: DeepSpeed's and Open MPI's variables", "[contracts]") {
  const ContractSet c = Parse("deepspeed,mpi");
  const auto env = For(c, TwoNodes(c, 1), 2);
  const Environment want{{"RANK", "4"},
                         {"LOCAL_SIZE", "3"},
                         {"CROSS_RANK", "1"},
                         {"CROSS_SIZE", "2"},
                         {"OMPI_COMM_WORLD_RANK", "4"},
                         {"OMPI_COMM_WORLD_SIZE", "5"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                         {"OMPI_COMM_WORLD_NODE_RANK", "1"}};
  CHECK(env == want);
  // Neither needs the round's members.
  GroupAssignment alone = TwoNodes(c, 1);
  alone.members.clear();
  CHECK(For(c, alone, 0).at("CROSS_RANK") == "1");
}

TEST_CASE("contracts: torch alone adds nothing", "[contracts]") {
  const ContractSet c;
  GroupAssignment g = TwoNodes(c, 0);
  g.members.clear();
  CHECK(For(c, g, 1) == Environment{{"RANK", "1"}});
}

TEST_CASE("contracts: a round without what a contract needs is refused naming it", "[contracts]") {
  const ContractSet c = Parse("tensorflow");
  Environment env;
  GroupAssignment g = TwoNodes(c, 0);
  g.members.pop_back();
  auto s = crun::agent::AddContractEnvironment(c, g, 0, env);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("--contract torch,tensorflow needs every node's address and ports, "
                         "and the round has those of 1 of its 2 nodes") == 0);
  g = TwoNodes(c, 0);
  g.members[1].ports.pop_back();  // beta runs another --contract
  s = crun::agent::AddContractEnvironment(c, g, 0, env);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message() ==
        "node 1 (beta) has 2 reserved ports for 3 workers where --contract torch,tensorflow "
        "needs 3: is it running crun with another --contract?");
  CHECK(env.empty());
}

namespace {

// A test-only contract, registered for one test: Ray's head address on group rank 0's node.
struct ScopedRay {
  crun::Contract ray = crun::RegisterContract(
      {.name = "ray",
       .aliases = {"rayd"},
       .gives = "RAY_ADDRESS",
       .ports = crun::ContractSpec::Ports::kPerNode,
       .environment = [](const crun::ContractRound& r, Environment& env) {
         env["RAY_ADDRESS"] = r.nodes.front().address + ":" + std::to_string(r.Port(0, ray_of(r)));
       }});
  static crun::Contract ray_of(const crun::ContractRound& r) {
    return r.contracts.contracts().back();
  }
  ~ScopedRay() { crun::UnregisterContract(ray); }
};

}  // namespace

TEST_CASE("contracts: one descriptor adds a contract with a port everywhere", "[contracts]") {
  const ScopedRay scoped;
  const ContractSet c = Parse("jax,rayd");
  CHECK(c.Has(scoped.ray));
  CHECK(c.ToString() == "torch,jax,ray");
  CHECK(c.NeedsPorts());
  CHECK(ContractSet::FromBits(c.bits()).Known());
  // Its port follows jax's, in the table's order; every node reserves it.
  const crun::PortLayout layout(c, 3);
  CHECK(layout.count() == 2);
  CHECK(layout.Port(scoped.ray) == 1u);
  CHECK(layout.Check(1).message() ==
        "1 reserved ports for 3 workers where --contract torch,jax,ray needs 2");
  // Its words, its help and its refusals come from the table.
  CHECK(crun::DescribeContracts().find("mpi (OMPI_COMM_WORLD_*), ray (rayd: RAY_ADDRESS);") !=
        std::string::npos);
  CHECK(crun::ParseContracts("rya").status().message() ==
        "unknown contract 'rya' (did you mean ray?); known: torch, tensorflow (tf), jax, "
        "horovod, deepspeed, mpi, ray (rayd)");
  // Every worker gets its variable, from group rank 0's port.
  Environment env;
  REQUIRE(crun::agent::AddContractEnvironment(c, TwoNodes(c, 1), 2, env).ok());
  CHECK(env["RAY_ADDRESS"] == "10.0.0.1:4001");
  CHECK(env["JAX_COORDINATOR_ADDRESS"] == "10.0.0.1:4000");
}

TEST_CASE("contracts: without the test's descriptor, its name is unknown again", "[contracts]") {
  CHECK_FALSE(crun::ParseContracts("ray").ok());
  CHECK_FALSE(ContractSet::FromBits(1u << crun::ContractSpecs().size()).Known());
}
