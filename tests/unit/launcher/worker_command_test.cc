// The worker's argv from the script as typed: Python scripts through the interpreter, native
// programs as themselves, --no-python, -m and --run-path; refusals name the script.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "launcher/worker_command.h"
#include "tests/unit/temp_dir.h"

namespace {

using namespace crun::launcher;
using Strings = std::vector<std::string>;

using crun::testing::TempDir;

}  // namespace

TEST_CASE("worker command: scripts, programs, modules", "[worker_command]") {
  TempDir dir;
  const std::string script = dir.path + "/train.py";
  std::ofstream(script) << "print('hi')\n";
  const Getenv env = FromTable({{"PATH", "/usr/bin:/bin"}});
  const Getenv pinned =
      FromTable({{"PATH", "/usr/bin:/bin"}, {"PYTHON_EXEC", "/opt/py/bin/python"}});

  WorkerCommandOptions o;
  o.command = {script, "--lr", "0.1"};
  CHECK(*WorkerCommand(o, env) == Strings{"python3", "-u", script, "--lr", "0.1"});
  CHECK(*WorkerCommand(o, pinned) == Strings{"/opt/py/bin/python", "-u", script, "--lr", "0.1"});
  CHECK(InterpreterNote(*WorkerCommand(o, pinned), o, pinned) ==
        "/opt/py/bin/python (from PYTHON_EXEC)");

  o.command = {"/bin/true", "a"};  // an ELF file: run as itself
  CHECK(*WorkerCommand(o, env) == Strings{"/bin/true", "a"});
  CHECK(InterpreterNote(*WorkerCommand(o, env), o, env).empty());
  o.command = {"true"};  // found on PATH
  CHECK(*WorkerCommand(o, env) == Strings{"true"});

  o.module = true;
  o.command = {"pkg.train", "--x"};
  CHECK(*WorkerCommand(o, env) == Strings{"python3", "-u", "-m", "pkg.train", "--x"});
  o.module = false;

  o.no_python = true;
  o.command = {"/bin/echo", "${local_rank}"};
  CHECK(*WorkerCommand(o, env) == Strings{"/bin/echo", "${local_rank}"});
  o.no_python = false;

  o.run_path = true;
  o.command = {script};
  const auto run_path = WorkerCommand(o, env);
  REQUIRE(run_path.ok());
  CHECK((*run_path)[2] == "-c");
  CHECK(run_path->back() == script);
}

TEST_CASE("worker command: refusals name the script", "[worker_command]") {
  TempDir dir;
  const Getenv env = FromTable({{"PATH", "/usr/bin:/bin"}});
  WorkerCommandOptions o;
  CHECK(WorkerCommand(o, env).status().message() == "no training script given");
  o.command = {dir.path + "/missing.py"};
  CHECK_THAT(WorkerCommand(o, env).status().message(),
             Catch::Contains("training script '" + dir.path + "/missing.py' does not exist"));
  o.no_python = true;
  o.command = {"no-such-program-here"};
  CHECK(WorkerCommand(o, env).status().message() ==
        "--no-python: 'no-such-program-here' is not an executable file");
  o.module = true;
  CHECK_THAT(WorkerCommand(o, env).status().message(), Catch::Contains("exclude each other"));
  o = {};
  // A copy of an ELF program without the execute bit.
  const std::string program = dir.path + "/prog";
  std::filesystem::copy_file("/bin/true", program);
  ::chmod(program.c_str(), 0644);
  o.command = {program};
  CHECK_THAT(WorkerCommand(o, env).status().message(),
             Catch::Contains("is a native program but not executable (chmod +x it)"));
  o.run_path = true;
  o.command = {dir.path + "/none.py"};
  CHECK_THAT(WorkerCommand(o, env).status().message(), Catch::Contains("--run-path: '"));
}
