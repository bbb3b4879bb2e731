// crun: the command-line entry point. `crun store`, `crun rendezvous`, `crun status`,
// `crun stacks` and `crun timeline` are subcommands; anything else is the torchrun-compatible
// launcher.
#include <signal.h>

#include <cstring>

#include <CLI/CLI.hpp>

#include "launcher/launch_command.h"
#include "launcher/logging.h"
#include "launcher/rendezvous_command.h"
#include "launcher/stacks_command.h"
#include "launcher/store_command.h"
#include "launcher/timeline_command.h"

int main(int argc, char** argv) {
  // Before any thread exists, so that none takes it: the agent reads SIGCHLD from a signalfd
  // (agent/supervise/attempt_edge.h). Workers start with an empty mask.
  sigset_t child;
  sigemptyset(&child);
  sigaddset(&child, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &child, nullptr);
  const bool store = argc > 1 && std::strcmp(argv[1], "store") == 0;
  const bool rendezvous = argc > 1 && std::strcmp(argv[1], "rendezvous") == 0;
  const bool status = argc > 1 && std::strcmp(argv[1], "status") == 0;
  const bool stacks = argc > 1 && std::strcmp(argv[1], "stacks") == 0;
  const bool timeline = argc > 1 && std::strcmp(argv[1], "timeline") == 0;
  if (store || rendezvous || status || stacks || timeline) {
    CLI::App app{"crun " + std::string(argv[1])};
    app.require_subcommand(1);
    int exit_code = 0;
    if (store) crun::launcher::AddStoreCommand(app, &exit_code);
    if (rendezvous) crun::launcher::AddRendezvousCommand(app, &exit_code);
    if (status) crun::launcher::AddStatusCommand(app, &exit_code);
    if (stacks) crun::launcher::AddStacksCommand(app, &exit_code);
    if (timeline) crun::launcher::AddTimelineCommand(app, &exit_code);
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      return app.exit(e);
    } catch (const CLI::ParseError& e) {
      app.exit(e);
      return 2;  // bad input: the message above names the flag and value
    }
    crun::launcher::FlushOutput();
    return exit_code;
  }
  const int code = crun::launcher::RunLaunch(argc, argv);
  // What crun queued for a slow reader (base/fd_writer.h) is written before it exits.
  crun::launcher::FlushOutput();
  return code;
}
