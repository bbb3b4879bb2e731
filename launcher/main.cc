// crun: the command-line entry point. `crun store ...` runs the standalone store; anything
// else is the torchrun-compatible launcher.
#include <cstring>

#include <CLI/CLI.hpp>

#include "launcher/launch_command.h"
#include "launcher/store_command.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "store") == 0) {
    CLI::App app{"crun store: a standalone c10d-compatible TCP store"};
    app.require_subcommand(1);
    int exit_code = 0;
    crun::launcher::AddStoreCommand(app, &exit_code);
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      return app.exit(e);
    } catch (const CLI::ParseError& e) {
      app.exit(e);
      return 2;  // bad input: the message above names the flag and value
    }
    return exit_code;
  }
  return crun::launcher::RunLaunch(argc, argv);
}
