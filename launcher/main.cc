// crun: the command-line entry point. Each subcommand lives in its own file.
#include <CLI/CLI.hpp>

#include "launcher/store_command.h"

int main(int argc, char** argv) {
  CLI::App app{"crun: a native elastic launcher for distributed training"};
  app.require_subcommand(1);
  int exit_code = 0;
  crun::launcher::AddStoreCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
