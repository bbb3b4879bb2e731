// Rank 0's progress, as train prints it: a bar redrawn in place on a terminal, plain lines every
// `log_every` steps otherwise. No libtorch.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace crun::train {

// "h:mm:ss" of `seconds` (0 for a negative time).
std::string Hms(double seconds);

class Progress {
 public:
  Progress(bool enabled, int log_every);
  // Whether Step() would print this step: the caller reads the loss (a GPU sync) only then.
  bool WillPrint(std::size_t step, std::size_t steps) const;
  void Step(int epoch, int epochs, std::size_t step, std::size_t steps, double loss, double lr,
            double images_per_s, double eta_s);
  void Line(const std::string& s);

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_, tty_;
  int log_every_;
  Clock::time_point last_draw_{};
};

}  // namespace crun::train
