#include "train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace crun::train {

std::string Hms(double seconds) {
  const long s = std::lround(std::max(seconds, 0.0));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

Progress::Progress(bool enabled, int log_every)
    : enabled_(enabled), tty_(enabled && ::isatty(STDOUT_FILENO)), log_every_(log_every) {}

bool Progress::WillPrint(std::size_t step, std::size_t steps) const {
  if (!enabled_) return false;
  if (step == steps) return true;
  if (tty_) return Clock::now() - last_draw_ >= std::chrono::milliseconds(250);
  return step % static_cast<std::size_t>(log_every_) == 0;
}
void Progress::Step(int epoch, int epochs, std::size_t step, std::size_t steps, double loss,
                    double lr, double images_per_s, double eta_s) {
  if (!WillPrint(step, steps)) return;
  last_draw_ = Clock::now();
  const bool last = step == steps;
  if (tty_) {
    const int width = 24;
    const int filled =
        static_cast<int>(width * static_cast<double>(step) / static_cast<double>(steps));
    std::printf("\repoch %d/%d [%s%s] %zu/%zu loss %.4f lr %.4f %.0f img/s ETA %s ", epoch, epochs,
                std::string(static_cast<std::size_t>(filled), '#').c_str(),
                std::string(static_cast<std::size_t>(width - filled), '.').c_str(), step, steps,
                loss, lr, images_per_s, Hms(eta_s).c_str());
    if (last) std::printf("\n");
    std::fflush(stdout);
  } else {
    std::printf("epoch %d/%d step %zu/%zu loss %.4f lr %.4f %.0f img/s eta %s\n", epoch, epochs,
                step, steps, loss, lr, images_per_s, Hms(eta_s).c_str());
    std::fflush(stdout);
  }
}
void Progress::Line(const std::string& s) {
  if (!enabled_) return;
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}
}  // namespace crun::train
