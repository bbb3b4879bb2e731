#include "launcher/launch_command.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <spdlog/spdlog.h>

#include "agent/local_agent.h"
#include "base/environment.h"
#include "base/host_addresses.h"
#include "launcher/horovodrun_spelling.h"
#include "launcher/launch_options.h"
#include "launcher/launch_plan.h"
#include "launcher/logging.h"

namespace crun::launcher {
namespace {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "crun: %s\n", message.c_str());
  return 2;
}

// A run id as one path component: [A-Za-z0-9._-], never "." or "..".
std::string PathComponent(const std::string& id) {
  std::string out = id.substr(0, 128);
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  return out;
}

// The run's own log directory, <base>/<run id>/<host>_<random> (mode 0700), made when the
// plan is acted on. Two nodes sharing a base (an NFS home) or two runs with the same id never
// share files.
struct LogDirs {
  std::string base, run, node;
  bool made_base = false;  // a temporary base of crun's own
  bool made_run = false;   // the run's directory did not exist before

  // At the end of a run, what holds nothing goes: the attempt and rank directories no log,
  // error file or failure report was written into, then this node's directory, the run's and a
  // temporary base of crun's own when they are empty. So a run that wrote nothing (one that
  // never started a worker, or that succeeded without logs to files) leaves nothing behind,
  // and one that did keeps exactly the directories that hold its files. The node directory is
  // this crun's own (mkdtemp), so nothing in it is anyone else's.
  void RemoveEmptyDirs() const {
    std::error_code ec;
    std::vector<std::string> below;  // pre-order: every parent before its children
    for (std::filesystem::recursive_directory_iterator it(node, ec), end; !ec && it != end;
         it.increment(ec)) {
      if (it->is_directory(ec)) below.push_back(it->path());
    }
    // rmdir removes only an empty directory, and no symlink or what it points to: trying each
    // one, deepest first, is the test.
    for (auto d = below.rbegin(); d != below.rend(); ++d) ::rmdir(d->c_str());
    if (::rmdir(node.c_str()) != 0) return;
    if (made_run) ::rmdir(run.c_str());
    if (made_base) ::rmdir(base.c_str());
  }
};

StatusOr<LogDirs> MakeRunLogDirs(const std::string& given, const std::string& run_id,
                                 const std::string& host) {
  LogDirs d;
  d.base = given;
  if (d.base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/crun_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return PosixError("cannot create a log directory from '" + pattern + "'", errno);
    }
    d.base = pattern;
    d.made_base = true;
  }
  d.run = d.base + "/" + PathComponent(run_id);
  // Another crun sharing the base may remove an empty run directory between our two steps
  // (RemoveEmptyDirs): then make it again.
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    const bool made = std::filesystem::create_directories(d.run, ec);
    if (ec) {
      return InvalidArgument("--log-dir '" + d.base + "': cannot create " + d.run + ": " +
                             ec.message());
    }
    d.made_run = d.made_run || made;
    std::string pattern = d.run + "/" + PathComponent(host) + "_XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) {
      d.node = pattern;
      return d;
    }
    if (errno != ENOENT || attempt == 3) {
      return PosixError("--log-dir '" + d.base + "': cannot create a directory in " + d.run, errno);
    }
  }
}

// What crun's own process sets before any worker: the token out of the environment,
// OMP_NUM_THREADS, SIGPIPE ignored, the forwarded signals named.
void PrepareThisProcess(const LaunchPlan& p) {
  // The workers have no use for the token: keep it out of their environment.
  ::unsetenv("CRUN_TOKEN");
  if (p.nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    ::setenv("OMP_NUM_THREADS", "1", 1);
    std::fprintf(stderr,
                 "crun: OMP_NUM_THREADS was unset; set to 1 for each of the %d workers "
                 "(set it to tune)\n",
                 p.nproc);
  }
  ::signal(SIGPIPE, SIG_IGN);
  // As torchrun 2.x does: workers see which signals their launcher forwards.
  ::setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", p.o.signals.c_str(), 1);
}

int Execute(LaunchPlan& p) {
  const LaunchOptions& o = p.o;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  auto dirs = MakeRunLogDirs(o.log_dir, p.run_id, host);
  if (!dirs.ok()) return UsageError(dirs.status().message());
  SetUpLogging("launch", o.log_level);
  for (const auto& note : p.notes) std::fprintf(stderr, "crun: %s\n", note.c_str());
  spdlog::info("logs of this node: {}", dirs->node);
  PrepareThisProcess(p);
  agent::AgentOptions agent_options = std::move(p.agent);
  agent_options.host_name = host;
  agent_options.log_dir = dirs->node;
  agent_options.health.dirs.insert(agent_options.health.dirs.begin(), dirs->node);
  agent_options.health.env = ToEnvp(CurrentEnvironment());
  boost::asio::io_context io(1);
  int code = 1;
  auto rendezvous = p.rendezvous->Open(p, io, agent_options);
  if (rendezvous.ok()) {
    {
      agent::LocalAgent agent(io, std::move(agent_options), std::move(rendezvous).value());
      code = agent.Run();
    }
    p.rendezvous->Close();
  } else {
    std::fprintf(stderr, "crun: %s\n", rendezvous.status().message().c_str());
  }
  dirs->RemoveEmptyDirs();
  return code;
}

}  // namespace

int RunLaunch(int argc, char** argv, const Backends& backends) {
  CLI::App
      app{"crun: a native elastic launcher for distributed training.\n"
          "  crun [options] script.py [args...]    (torchrun-compatible)\n"
          "  crun store --help                      (a standalone c10d store)",
          "crun"};
  app.set_version_flag("--version", "crun " CRUN_VERSION);
  app.prefix_command();  // everything from the script on belongs to the worker
  LaunchOptions o;
  AddLaunchOptions(app, o);
  DescribeBackends(app, backends);
  std::vector<std::string> words(argv + 1, argv + argc);
  auto rewritten =
      RewriteHorovodrunSpelling(words, [](const std::string& h) { return NamesThisHost(h); });
  if (!rewritten.ok()) return UsageError(rewritten.status().message());
  if (*rewritten != words) {
    std::string line;
    for (const auto& w : *rewritten) {
      if (w == "--no-python") break;
      line += " " + w;
    }
    std::fprintf(stderr, "crun: horovodrun's spelling, as crun's:%s --no-python ...\n",
                 line.c_str());
  }
  std::vector<std::string> reversed(rewritten->rbegin(), rewritten->rend());  // CLI11's order
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return UsageError(e.what());
  }
  if (!o.print_completion.empty()) {
    auto script = CompletionScript(o.print_completion, KnownLongOptions(app));
    if (!script.ok()) return UsageError(script.status().message());
    std::fputs(script->c_str(), stdout);
    return 0;
  }
  o.command = app.remaining();
  if (!o.command.empty() && o.command[0] == "--") {
    o.command.erase(o.command.begin());
  } else if (!o.command.empty() && o.command[0].size() > 1 && o.command[0][0] == '-') {
    // An option before the script that crun does not know: a typo, or a flag of another tool.
    return UsageError(UnknownOptionMessage(o.command[0], KnownLongOptions(app)));
  }
  auto plan = PlanLaunch(std::move(o), GivenFlags(app), MachineFacts::OfThisMachine(), backends);
  if (!plan.ok()) return UsageError(plan.status().message());
  return Execute(*plan);
}

}  // namespace crun::launcher
