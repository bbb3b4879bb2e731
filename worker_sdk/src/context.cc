#include "crun/worker/context.h"

#include <cstdlib>
#include <limits>

#include "base/numbers.h"
#include "crun/worker/env_names.h"
#include "rendezvous/store/tcp_store_client.h"

namespace crun::worker {
namespace {

// One variable of the contract, read through `lookup`.
class Reader {
 public:
  explicit Reader(const EnvLookup& lookup) : lookup_(lookup) {}

  StatusOr<std::string> Text(const char* name, const char* fallback = nullptr) {
    const char* v = lookup_(name);
    if (v == nullptr) {
      if (fallback != nullptr) return std::string(fallback);
      return InvalidArgument(std::string(name) +
                             " is not set: start this program with crun (or torchrun), which "
                             "sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, "
                             "MASTER_ADDR and MASTER_PORT for every worker");
    }
    return std::string(v);
  }

  StatusOr<long> Integer(const char* name, long min, long max, const char* fallback = nullptr) {
    auto text = Text(name, fallback);
    if (!text.ok()) return text.status();
    const std::string& s = *text;
    const auto parsed =
        ParseInteger(s, std::numeric_limits<long>::min(), std::numeric_limits<long>::max());
    if (!parsed) return InvalidArgument(std::string(name) + "='" + s + "' is not an integer");
    const long v = static_cast<long>(*parsed);
    if (v < min || v > max) {
      return InvalidArgument(std::string(name) + "=" + s + " is out of range (" +
                             std::to_string(min) + ".." + std::to_string(max) + ")");
    }
    return v;
  }

 private:
  const EnvLookup& lookup_;
};

const char* ProcessEnv(const char* name) { return std::getenv(name); }

}  // namespace

StatusOr<WorkerEnv> ReadWorkerEnv(const EnvLookup& lookup_in) {
  const EnvLookup lookup = lookup_in ? lookup_in : EnvLookup(ProcessEnv);
  Reader r(lookup);
  constexpr long kMaxInt = std::numeric_limits<int>::max();
  WorkerEnv e;
  auto integer = [&](int* out, const char* name, long min, const char* fallback = nullptr) {
    auto v = r.Integer(name, min, kMaxInt, fallback);
    if (!v.ok()) return v.status();
    *out = static_cast<int>(*v);
    return Status::Ok();
  };
  CRUN_RETURN_IF_ERROR(integer(&e.world_size, env::kWorldSize, 1));
  CRUN_RETURN_IF_ERROR(integer(&e.rank, env::kRank, 0));
  CRUN_RETURN_IF_ERROR(integer(&e.local_world_size, env::kLocalWorldSize, 1));
  CRUN_RETURN_IF_ERROR(integer(&e.local_rank, env::kLocalRank, 0));
  CRUN_RETURN_IF_ERROR(integer(&e.group_rank, env::kGroupRank, 0));
  CRUN_RETURN_IF_ERROR(integer(&e.group_world_size, env::kGroupWorldSize, 1, "1"));
  CRUN_RETURN_IF_ERROR(integer(&e.restart_count, env::kRestartCount, 0, "0"));
  CRUN_RETURN_IF_ERROR(integer(&e.max_restarts, env::kMaxRestarts, 0, "0"));
  auto run_id = r.Text(env::kRunId, "");
  if (!run_id.ok()) return run_id.status();
  e.run_id = *run_id;
  auto addr = r.Text(env::kMasterAddr);
  if (!addr.ok()) return addr.status();
  if (addr->empty()) return InvalidArgument(std::string(env::kMasterAddr) + " is empty");
  e.master_addr = *addr;
  auto port = r.Integer(env::kMasterPort, 1, 65535);
  if (!port.ok()) return port.status();
  e.master_port = static_cast<std::uint16_t>(*port);

  auto pair = [](const char* a, int av, const char* b, int bv) {
    return std::string(a) + "=" + std::to_string(av) + " is not below " + b + "=" +
           std::to_string(bv);
  };
  if (e.rank >= e.world_size) {
    return InvalidArgument(pair(env::kRank, e.rank, env::kWorldSize, e.world_size));
  }
  if (e.local_rank >= e.local_world_size) {
    return InvalidArgument(
        pair(env::kLocalRank, e.local_rank, env::kLocalWorldSize, e.local_world_size));
  }
  if (e.group_rank >= e.group_world_size) {
    return InvalidArgument(
        pair(env::kGroupRank, e.group_rank, env::kGroupWorldSize, e.group_world_size));
  }
  if (e.local_world_size > e.world_size) {
    return InvalidArgument(std::string(env::kLocalWorldSize) + "=" +
                           std::to_string(e.local_world_size) + " exceeds " + env::kWorldSize +
                           "=" + std::to_string(e.world_size));
  }
  return e;
}

Context::Context(WorkerEnv env, std::shared_ptr<Store> store)
    : env_(std::move(env)), store_(std::move(store)) {}

StatusOr<std::unique_ptr<Context>> Context::FromEnvironment(const ContextOptions& options,
                                                            const EnvLookup& lookup) {
  auto env = ReadWorkerEnv(lookup);
  if (!env.ok()) return env.status();
  TcpStoreClientOptions o;
  o.host = env->master_addr;
  o.port = env->master_port;
  o.connect_timeout = options.connect_timeout;
  o.timeout = options.store_timeout;
  auto client = TcpStoreClient::Connect(o);
  if (!client.ok()) {
    return Status(client.status().code(),
                  "rank " + std::to_string(env->rank) +
                      ": cannot use the job's store: " + client.status().message());
  }
  std::shared_ptr<Store> store = std::move(client).value();
  return std::make_unique<Context>(std::move(env).value(), std::move(store));
}

std::string Context::round_prefix() const {
  return "crun/worker/" + env_.run_id + "/" + std::to_string(env_.restart_count) + "/";
}

}  // namespace crun::worker
