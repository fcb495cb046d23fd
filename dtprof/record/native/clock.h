// The host clock both native sources stamp times with.
#pragma once

#include <time.h>

#include <cstdint>

namespace dtprof {

// CLOCK_MONOTONIC: the clock of Python's time.perf_counter_ns() on Linux (checked on load)
inline int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace dtprof
