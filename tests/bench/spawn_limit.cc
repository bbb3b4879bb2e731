// The floor under any launcher, for launch_bench.py: starts N copies of a program (fork and
// exec, as a launcher must), waits for all of them and exits 0 if all exited 0. With N = 0 it
// is the cost of starting and ending a minimal C++ program.
//
//   spawn_limit N PROGRAM [ARGS...]
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: spawn_limit N PROGRAM [ARGS...]\n");
    return 2;
  }
  char* end = nullptr;
  const long n = std::strtol(argv[1], &end, 10);
  if (*end != '\0' || n < 0 || n > 4096) {
    std::fprintf(stderr, "spawn_limit: N '%s' is not a count from 0 to 4096\n", argv[1]);
    return 2;
  }
  for (long i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("spawn_limit: fork");
      return 1;
    }
    if (pid == 0) {
      execvp(argv[2], argv + 2);
      _exit(127);
    }
  }
  int failed = 0;
  for (long i = 0; i < n; ++i) {
    int status = 0;
    while (wait(&status) < 0) {
      if (errno != EINTR) return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
