// Start and restart-latency probe (benchmark worker), compiled so that its first action is the
// timestamp. Works across nodes that share OUT_DIR (loopback "nodes" on one machine).
//
//   restart_probe OUT_DIR start     record OUT_DIR/start_<RANK> and exit 0
//   restart_probe OUT_DIR hold      before OUT_DIR/lost exists (a machine is about to be lost):
//     write OUT_DIR/held_<RANK>_<pid> and wait to be stopped; after: record start_<RANK>, exit 0
//   restart_probe OUT_DIR           the restart dance:
//     first round (no OUT_DIR/crash yet): every worker marks itself ready; once all WORLD_SIZE
//     are (so the failure is not mixed up with the launch), rank 0 records the time in
//     OUT_DIR/crash and fails; the others wait to be stopped.
//     after the failure (OUT_DIR/crash exists): every worker records OUT_DIR/start_<RANK>
//     and exits 0.
// The round is told by the crash file, not TORCHELASTIC_RESTART_COUNT: torchrun gives nodes
// that did not fail a count of 0 again. Times: nanoseconds since the epoch (CLOCK_REALTIME).
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

int Record(const std::string& path, const timespec& t) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return 3;
  std::fprintf(f, "%lld\n", static_cast<long long>(t.tv_sec) * 1000000000LL + t.tv_nsec);
  std::fclose(f);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (argc < 2 || rank == nullptr || world == nullptr) return 2;
  const std::string dir = argv[1];
  const bool start_only = argc > 2 && std::strcmp(argv[2], "start") == 0;
  if (start_only || Exists(dir + "/crash")) return Record(dir + "/start_" + rank, now);
  if (argc > 2 && std::strcmp(argv[2], "hold") == 0) {
    if (Exists(dir + "/lost")) return Record(dir + "/start_" + rank, now);
    const std::string held = dir + "/held_" + rank + "_" + std::to_string(getpid());
    if (FILE* h = std::fopen(held.c_str(), "w")) std::fclose(h);
    pause();  // wait to be stopped (or killed with the machine)
    return 0;
  }

  if (FILE* r = std::fopen((dir + "/ready_" + rank).c_str(), "w")) std::fclose(r);
  if (std::string(rank) != "0") {
    pause();  // wait to be stopped
    return 0;
  }
  const int n = std::atoi(world);
  for (int i = 0; i < n;) {  // the benchmark's own wait for the launch to complete
    if (Exists(dir + "/ready_" + std::to_string(i))) {
      ++i;
    } else {
      usleep(200);
    }
  }
  clock_gettime(CLOCK_REALTIME, &now);
  if (int rc = Record(dir + "/crash", now); rc != 0) return rc;
  return 1;
}
