// Store limits small enough that the fuzzers reach every limit check with short inputs.
#pragma once

#include "rendezvous/store/limits.h"

namespace crun::fuzz {

inline StoreLimits TightLimits() {
  StoreLimits l;
  l.max_key_bytes = 64;
  l.max_value_bytes = 512;
  l.max_keys_per_request = 16;
  l.max_request_bytes = 2048;
  l.max_store_bytes = 16 * 1024;
  l.max_waits_per_connection = 8;
  l.max_pending_waits = 12;
  return l;
}

}  // namespace crun::fuzz
