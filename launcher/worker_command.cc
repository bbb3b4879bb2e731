#include "launcher/worker_command.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace crun::launcher {
namespace {

// PYTHON_EXEC when set, else python3.
std::string Python(const Getenv& getenv) {
  const char* python = Lookup(getenv, "PYTHON_EXEC");
  return python != nullptr && *python ? python : "python3";
}

// Whether `path` is a native program (an ELF file). Python cannot run one, so crun runs it as
// itself even without --no-python: `crun --nproc-per-node 2 ./train` does what it says.
bool IsNativeProgram(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic,
                                          "\x7f"
                                          "ELF",
                                          4) == 0;
}

// torchrun's --run-path: the script runs through runpy.run_path inside the interpreter (it
// takes precedence over --no-python, as in torchrun).
StatusOr<std::vector<std::string>> RunPathCommand(const WorkerCommandOptions& o,
                                                  const Getenv& getenv) {
  if (::access(o.command[0].c_str(), R_OK) != 0) {
    return InvalidArgument("--run-path: '" + o.command[0] + "' does not exist or is not readable");
  }
  std::vector<std::string> argv{Python(getenv), "-u", "-c",
                                "import runpy, sys; sys.argv = sys.argv[1:]; "
                                "runpy.run_path(sys.argv[0], run_name='__main__')"};
  argv.insert(argv.end(), o.command.begin(), o.command.end());
  return argv;
}

// A native program given as a path or found on PATH (a script in the working directory comes
// first, as it would for Python); nothing when the script is not one.
StatusOr<std::vector<std::string>> NativeCommand(const WorkerCommandOptions& o,
                                                 const Getenv& getenv) {
  const std::string& script = o.command[0];
  const bool readable = ::access(script.c_str(), R_OK) == 0;
  const std::string program = readable ? script : FindExecutable(script, getenv);
  if (program.empty() || !IsNativeProgram(program)) return std::vector<std::string>{};
  if (::access(program.c_str(), X_OK) != 0) {
    return InvalidArgument("'" + script + "' is a native program but not executable (chmod +x it)");
  }
  std::vector<std::string> argv = o.command;
  if (script.find('/') == std::string::npos && readable) argv[0] = "./" + script;
  return argv;
}

}  // namespace

std::string FindExecutable(const std::string& program, const Getenv& getenv) {
  if (program.find('/') != std::string::npos) {
    return ::access(program.c_str(), X_OK) == 0 ? program : std::string();
  }
  const char* path = Lookup(getenv, "PATH");
  const std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const auto end = dirs.find(':', start);
    const std::string dir =
        dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return {};
}

StatusOr<std::vector<std::string>> WorkerCommand(const WorkerCommandOptions& o,
                                                 const Getenv& getenv) {
  if (o.command.empty()) return InvalidArgument("no training script given");
  if (o.run_path) return RunPathCommand(o, getenv);
  if (o.module && o.no_python) {
    return InvalidArgument("-m/--module and --no-python exclude each other");
  }
  const std::string& script = o.command[0];
  if (o.no_python) {
    if (FindExecutable(script, getenv).empty()) {
      return InvalidArgument("--no-python: '" + script + "' is not an executable file");
    }
    return o.command;
  }
  if (!o.module) {
    auto native = NativeCommand(o, getenv);
    if (!native.ok() || !native->empty()) return native;
    if (::access(script.c_str(), R_OK) != 0) {
      return InvalidArgument("training script '" + script + "' does not exist or is not readable");
    }
  }
  std::vector<std::string> argv{Python(getenv), "-u"};
  if (o.module) argv.push_back("-m");
  argv.insert(argv.end(), o.command.begin(), o.command.end());
  return argv;
}

std::string InterpreterNote(const std::vector<std::string>& argv, const WorkerCommandOptions& o,
                            const Getenv& getenv) {
  if (o.no_python && !o.run_path) return {};
  if (argv.size() < 2 || argv[1] != "-u") return {};  // a native program
  const char* exec = Lookup(getenv, "PYTHON_EXEC");
  if (exec != nullptr && *exec) return std::string(exec) + " (from PYTHON_EXEC)";
  const std::string found = FindExecutable("python3", getenv);
  return (found.empty() ? std::string("python3") : found) +
         " (python3 on PATH; set PYTHON_EXEC to use another)";
}

}  // namespace crun::launcher
