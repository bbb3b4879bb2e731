// The worker's command line, torchrun's way: [python, -u, (-m), script, args...], the script
// itself with --no-python, or a native program (an ELF file) as itself. Reads the file system
// (is the script there, executable, an ELF file?) and PYTHON_EXEC through `getenv`; changes
// nothing.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "launcher/getenv.h"

namespace crun::launcher {

struct WorkerCommandOptions {
  std::vector<std::string> command;  // script and its arguments, as typed
  bool module = false;               // -m
  bool no_python = false;            // --no-python
  bool run_path = false;             // --run-path
};

// The argv each worker runs. An error names the script and what is wrong with it.
StatusOr<std::vector<std::string>> WorkerCommand(const WorkerCommandOptions& o,
                                                 const Getenv& getenv = {});

// How the interpreter of Python workers was chosen, for the failure report's hint
// ("/usr/bin/python3 (python3 on PATH; set PYTHON_EXEC to use another)"); "" for a native
// program or --no-python.
std::string InterpreterNote(const std::vector<std::string>& argv, const WorkerCommandOptions& o,
                            const Getenv& getenv = {});

// Where a shell would find `program`: the path itself when it names a directory, else the
// first executable match on PATH. Empty when there is none.
std::string FindExecutable(const std::string& program, const Getenv& getenv = {});

}  // namespace crun::launcher
