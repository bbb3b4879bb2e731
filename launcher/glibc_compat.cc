// What lets the statically linked C++ runtime in crun run on glibc 2.34 (Ubuntu 22.04, RHEL 9)
// although it was built against Debian 12's 2.36 (docs/install.md). libstdc++'s
// std::random_device calls arc4random, which glibc exports only from 2.36 on: crun is linked
// with --wrap=arc4random, so that call lands here instead, and is served from the kernel's
// generator as glibc's own arc4random is.
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

extern "C" std::uint32_t __wrap_arc4random() {
  std::uint32_t value = 0;
  for (;;) {
    const ssize_t n = getrandom(&value, sizeof value, 0);
    if (n == static_cast<ssize_t>(sizeof value)) return value;
    if (n < 0 && errno != EINTR) std::abort();  // as glibc: no way to go on without entropy
  }
}
