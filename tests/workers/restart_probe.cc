// Restart-latency probe (benchmark worker), compiled so that its first action is the
// timestamp. Attempt 0: every worker marks itself ready; once all are (so the failure is not
// mixed up with the launch), local rank 0 records the time and fails, the others wait to be
// stopped. Attempt 1: every worker records its start time and exits 0.
// Usage: restart_probe OUT_DIR. Times: nanoseconds since the epoch (CLOCK_REALTIME).
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  if (argc < 2) return 2;
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const char* local_rank = std::getenv("LOCAL_RANK");
  if (attempt == nullptr || local_rank == nullptr) return 2;
  const std::string first = std::string(attempt) == "0" ? "crash" : "";
  if (!first.empty()) {
    const std::string dir = argv[1];
    if (FILE* r = std::fopen((dir + "/ready_" + local_rank).c_str(), "w")) std::fclose(r);
    if (std::string(local_rank) != "0") {
      pause();  // wait to be stopped
      return 0;
    }
    const char* world = std::getenv("LOCAL_WORLD_SIZE");
    const int n = world != nullptr ? std::atoi(world) : 1;
    for (int i = 0; i < n;) {  // the benchmark's own wait for the launch to complete
      if (access((dir + "/ready_" + std::to_string(i)).c_str(), F_OK) == 0) {
        ++i;
      } else {
        usleep(200);
      }
    }
    clock_gettime(CLOCK_REALTIME, &now);
  }
  const std::string path = std::string(argv[1]) + "/" +
                           (first.empty() ? "start_" + std::string(local_rank) : first);
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return 3;
  std::fprintf(f, "%lld\n", static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
  std::fclose(f);
  return first.empty() ? 0 : 1;
}
