#include "launcher/stacks_command.h"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <grpcpp/grpcpp.h>

#include "agent/hangs/control_socket.h"
#include "agent/hangs/stack_summary.h"
#include "agent/rendezvous/session_client.h"
#include "agent/rendezvous/session_wire.h"
#include "base/endpoint.h"
#include "base/numbers.h"
#include "base/security.h"
#include "crun/v1/rendezvous.grpc.pb.h"
#include "launcher/logging.h"
#include "launcher/security_flags.h"

namespace crun::launcher {
namespace {

struct StacksOptions {
  std::string pid;
  std::string log_dir;
  std::string endpoint;  // a multi-node job: its rendezvous service
  std::string run_id;
  crun::SecurityFlags security;
  bool json = false;
  double timeout = 60;
};

// The grouped summary of `stacks`, then each node that gave none; 0 when every rank was read.
int PrintStacks(const std::vector<agent::RankStacks>& stacks,
                const std::vector<std::string>& missing) {
  std::printf("Where every rank is:\n%s", agent::FormatStacks(stacks, {}).c_str());
  for (const auto& m : missing) std::printf("No stacks from %s\n", m.c_str());
  int unread = 0;
  for (const auto& s : stacks) unread += s.tool.empty() ? 1 : 0;
  return unread == 0 && missing.empty() ? 0 : 1;
}

// `crun stacks --rdzv-endpoint H:P --rdzv-id ID`: the service asks every node of the job.
int RunRemote(const StacksOptions& o) {
  SetUpLogging("stacks", "warn");  // gRPC's own lines go to debug, not onto the terminal
  if (!o.pid.empty() || !o.log_dir.empty()) {
    std::fprintf(stderr, "crun stacks: give a PID, --log-dir or --rdzv-endpoint (one of them)\n");
    return 2;
  }
  if (o.run_id.empty()) {
    std::fprintf(stderr, "crun stacks: --rdzv-endpoint needs --rdzv-id (the job's run id)\n");
    return 2;
  }
  auto parsed = crun::ParseEndpoint(o.endpoint, 29400);
  if (!parsed.ok()) {
    std::fprintf(stderr, "crun stacks: --rdzv-endpoint: %s\n", parsed.status().message().c_str());
    return 2;
  }
  auto security = crun::LoadSecurity(o.security, "client");
  if (!security.ok()) {
    std::fprintf(stderr, "crun stacks: %s\n", security.status().message().c_str());
    return 2;
  }
  const std::string target = crun::FormatEndpoint(parsed->host, parsed->port);
  agent::ChannelOptions co;
  co.security = *security;
  auto stub = v1::Rendezvous::NewStub(agent::MakeChannel(target, co));
  const auto timeout = std::chrono::milliseconds(static_cast<long>(o.timeout * 1000));
  const auto deadline = std::chrono::system_clock::now() + timeout;
  v1::StacksQuery req;
  req.set_run_id(o.run_id);
  // The service waits for the nodes until a second before this call's deadline.
  req.set_timeout_ms(std::max<long>(1000, timeout.count() - 1000));
  v1::StacksResult resp;
  const auto ask = [&](bool wait_for_ready) {
    grpc::ClientContext ctx;
    if (!security->token.empty()) ctx.AddMetadata(crun::kTokenHeader, security->token);
    ctx.set_deadline(deadline);
    ctx.set_wait_for_ready(wait_for_ready);
    return stub->Stacks(&ctx, req, &resp);
  };
  auto s = ask(false);
  // A service too busy to finish the handshake at once (rdzv::GaveUpConnecting): wait for it.
  if (rdzv::GaveUpConnecting(s)) {
    const auto again = ask(true);
    if (again.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) s = again;
  }
  if (!s.ok()) {
    const bool refused = s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                         s.error_code() == grpc::StatusCode::NOT_FOUND;
    std::fprintf(stderr, "crun stacks: %s from the rendezvous service at %s: %s\n",
                 refused ? "no stacks" : "no answer", target.c_str(), s.error_message().c_str());
    return 1;
  }
  const agent::RemoteStacks stacks = agent::RemoteStacksFromProto(resp);
  if (o.json) {
    nlohmann::json j{{"run_id", resp.run_id()}, {"round", resp.round()}};
    j["stacks"] = nlohmann::json::array();
    for (const auto& st : stacks.ranks) j["stacks"].push_back(agent::StacksJson(st));
    j["missing"] = stacks.missing;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return stacks.missing.empty() ? 0 : 1;
  }
  std::printf("crun stacks: run %s (round %d) through %s: %zu ranks on %d nodes\n",
              resp.run_id().c_str(), resp.round(), target.c_str(), stacks.ranks.size(),
              resp.nodes_size());
  return PrintStacks(stacks.ranks, stacks.missing);
}

// The live cruns whose crun.pid lies under `dir` (at most three levels down: <log-dir>/<run
// id>/<host>_XXXXXX/crun.pid).
std::vector<pid_t> CrunsUnder(const std::string& dir, std::vector<std::string>* stale) {
  std::vector<pid_t> out;
  namespace fs = std::filesystem;
  std::error_code ec;
  auto check = [&](const fs::path& file) {
    std::ifstream in(file);
    long pid = 0;
    if (!(in >> pid) || pid <= 0) return;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) {
      out.push_back(static_cast<pid_t>(pid));
    } else {
      stale->push_back(file.string() + " (pid " + std::to_string(pid) + ", no longer running)");
    }
  };
  if (fs::exists(fs::path(dir) / "crun.pid", ec)) check(fs::path(dir) / "crun.pid");
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it.depth() > 2) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->path().filename() == "crun.pid" && it->path().parent_path() != fs::path(dir)) {
      check(it->path());
    }
  }
  return out;
}

int Run(const StacksOptions& o) {
  if (!o.endpoint.empty()) return RunRemote(o);
  if (o.pid.empty() == o.log_dir.empty()) {
    std::fprintf(stderr,
                 "crun stacks: give the crun's PID, --log-dir DIR or --rdzv-endpoint H:P with "
                 "--rdzv-id ID (one of them)\n");
    return 2;
  }
  pid_t pid = 0;
  if (!o.pid.empty()) {
    const auto parsed = ParseInteger(o.pid, 1, 1 << 30);
    if (!parsed) {
      std::fprintf(stderr, "crun stacks: PID '%s' is not a process id\n", o.pid.c_str());
      return 2;
    }
    pid = static_cast<pid_t>(*parsed);
  } else {
    std::error_code ec;
    if (!std::filesystem::is_directory(o.log_dir, ec)) {
      std::fprintf(stderr, "crun stacks: --log-dir '%s' is not a directory\n", o.log_dir.c_str());
      return 2;
    }
    std::vector<std::string> stale;
    const auto found = CrunsUnder(o.log_dir, &stale);
    if (found.size() != 1) {
      std::fprintf(stderr, "crun stacks: %s under %s\n",
                   found.empty() ? "no running crun" : "more than one running crun",
                   o.log_dir.c_str());
      for (pid_t p : found) std::fprintf(stderr, "  crun pid %d: crun stacks %d\n", p, p);
      for (const auto& s : stale) std::fprintf(stderr, "  %s\n", s.c_str());
      return 1;
    }
    pid = found.front();
  }
  auto answer = agent::AskControl(pid, "stacks",
                                  std::chrono::milliseconds(static_cast<long>(o.timeout * 1000)));
  if (!answer.ok()) {
    std::fprintf(stderr, "crun stacks: %s\n", answer.status().message().c_str());
    return 1;
  }
  const auto j = nlohmann::json::parse(*answer, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    std::fprintf(stderr, "crun stacks: crun (pid %d) answered something that is not JSON\n", pid);
    return 1;
  }
  if (j.contains("error")) {
    std::fprintf(stderr, "crun stacks: crun (pid %d): %s\n", pid,
                 j["error"].get<std::string>().c_str());
    return 1;
  }
  if (o.json) {
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::vector<agent::RankStacks> stacks;
  if (j.contains("stacks") && j["stacks"].is_array()) {
    for (const auto& s : j["stacks"]) stacks.push_back(agent::StacksFromJson(s));
  }
  std::printf("crun stacks: run %s on %s (crun pid %d, attempt %d): %zu ranks\n",
              j.value("run_id", "").c_str(), j.value("host", "").c_str(), pid,
              j.value("attempt", 0), stacks.size());
  return PrintStacks(stacks, {});
}

}  // namespace

void AddStacksCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<StacksOptions>();
  CLI::App* cmd = app.add_subcommand(
      "stacks", "Show where every rank of a running job is (its stacks), without stopping it");
  cmd->add_option("pid", o->pid, "The crun launcher's process id");
  cmd->add_option("--log-dir,--log_dir", o->log_dir,
                  "Find the crun by its logs: its --log-dir or a directory below");
  cmd->add_option("--rdzv-endpoint,--rdzv_endpoint", o->endpoint,
                  "A multi-node job: its rendezvous service, host[:port] (port 29400)");
  cmd->add_option("--rdzv-id,--rdzv_id", o->run_id, "With --rdzv-endpoint: the job's run id");
  cmd->add_flag("--json", o->json, "Machine-readable output");
  cmd->add_option("--timeout", o->timeout, "Seconds to wait for the answer")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  AddSecurityFlags(cmd, &o->security);
  cmd->callback([o, exit_code] { *exit_code = Run(*o); });
}

}  // namespace crun::launcher
