// Hand-offs through libraries that ThreadSanitizer does not see.
//
// Debian's gRPC is not built with -fsanitize=thread: an object written on one thread, handed to
// gRPC with an operation's tag, and read on the thread that takes the tag back from a
// completion queue is ordered by gRPC's own atomics, which TSan never saw. Handed(p) before the
// hand-off and Taken(p) after it tell TSan of that order (its release and acquire annotations);
// in every other build they are nothing at all.
#pragma once

// GCC says -fsanitize=thread with __SANITIZE_THREAD__, clang with __has_feature.
#if defined(__SANITIZE_THREAD__)
#define CRUN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CRUN_TSAN 1
#endif
#endif

#if defined(CRUN_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace crun {

inline void Handed(void* p) {
#if defined(CRUN_TSAN)
  __tsan_release(p);
#else
  (void)p;
#endif
}

inline void Taken(void* p) {
#if defined(CRUN_TSAN)
  __tsan_acquire(p);
#else
  (void)p;
#endif
}

}  // namespace crun
