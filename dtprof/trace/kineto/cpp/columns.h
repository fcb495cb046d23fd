// What the native Kineto reader's files share: the columns a trace is scanned into and the
// scan's result (Fallback, Strings, Group, Columns, Result), the name tests the scan makes, and
// the call that crosses from one file to another. Hidden: nothing declared here is exported
// from the module, whose interface is scan.cpp's Python module alone.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <string_view>
#include <vector>

namespace dtprof_kineto __attribute__((visibility("hidden"))) {

struct Fallback {
  const char* why;
  int64_t at;
};

// Strings as Arrow lays them out: int32 offsets, bytes, a validity byte each.
struct Strings {
  std::vector<int32_t> offsets{0};
  std::string data;
  std::vector<uint8_t> valid;

  void add(std::string_view s, bool present) {
    if (data.size() + s.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      throw Fallback{"strings past 2 GiB", -1};
    data.append(s);
    offsets.push_back(static_cast<int32_t>(data.size()));
    valid.push_back(present ? 1 : 0);
  }
};

// The columns both event groups have: GPU activity and CPU events.
struct Group {
  Strings name, cat;
  std::vector<double> ts, dur;
  std::vector<int64_t> pid, tid;
};

struct Columns {
  int64_t events = 0;
  Strings header;  // the raw JSON of HEADER_KEYS, in that order (null where absent)
  Group gpu, cpu;
  std::vector<double> launch_ts, memory_ts, memory_allocated, memory_reserved;
  std::vector<int64_t> gpu_stream, gpu_correlation, gpu_bytes;
  std::vector<int64_t> launch_tid, launch_correlation;
  Strings cpu_args;  // comm events' args object as raw JSON; null for other events
  std::vector<int64_t> memory_device_type;

  // Room for the GPU, launch and memory columns of a trace of so many bytes, at a little above
  // the densities of real traces (a V100 rank: a GPU event per 2,400 bytes, a launch per
  // 1,300, a memory reading per 1,900, kernel names a twelfth of the bytes), so that most
  // never grow by copying. Room not filled is never touched: it takes no memory. (Room refused
  // is no error: the columns then grow as they fill.)
  void expect(int64_t bytes) {
    const size_t n = static_cast<size_t>(bytes);
    try {
      for (Strings* s : {&gpu.name, &gpu.cat}) {
        s->offsets.reserve(n / 2000);
        s->valid.reserve(n / 2000);
      }
      gpu.name.data.reserve(n / 10);
      gpu.cat.data.reserve(n / 300);
      for (auto* v : {&gpu.ts, &gpu.dur}) v->reserve(n / 2000);
      for (auto* v : {&gpu.pid, &gpu.tid, &gpu_stream, &gpu_correlation, &gpu_bytes})
        v->reserve(n / 2000);
      for (auto* v : {&launch_tid, &launch_correlation}) v->reserve(n / 1000);
      launch_ts.reserve(n / 1000);
      for (auto* v : {&memory_ts, &memory_allocated, &memory_reserved}) v->reserve(n / 1500);
      memory_device_type.reserve(n / 1500);
    } catch (const std::bad_alloc&) {
    }
  }
};

struct Result {
  Columns cols;
  int status = 0;  // 0: read; 1: given back to the Python reader; 2: gzip (inflate, then scan)
  std::string why;
  int64_t at = -1;
};

// s == word, for a literal word: lengths first, then a fixed-size compare the compiler inlines.
template <size_t N>
inline bool is(std::string_view s, const char (&word)[N]) {
  return s.size() == N - 1 && std::memcmp(s.data(), word, N - 1) == 0;
}

template <size_t N>
inline bool starts(std::string_view s, const char (&word)[N]) {
  return s.size() >= N - 1 && std::memcmp(s.data(), word, N - 1) == 0;
}

// ProfilerStep#N with optional whitespace (re.ASCII \s) around '#', and at least one digit.
inline bool is_step(std::string_view n) {
  if (!starts(n, "ProfilerStep")) return false;
  size_t i = sizeof("ProfilerStep") - 1;
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (i < n.size() && space(n[i])) ++i;
  if (i >= n.size() || n[i] != '#') return false;
  ++i;
  while (i < n.size() && space(n[i])) ++i;
  return i < n.size() && n[i] >= '0' && n[i] <= '9';
}

inline bool is_comm_annotation(std::string_view n) {
  if (n.size() < 4) return false;
  switch (n[0]) {  // most names start otherwise: one test for them
    case 'n': return starts(n, "nccl:");
    case 'g': return starts(n, "gloo:");
    case 'm': return starts(n, "mpi:");
    case 'u': return starts(n, "ucc:");
    case 'x': return starts(n, "xccl:");
    default: return false;
  }
}

// The calls from one file to another: once per trace, or once per collective, never per event
// (whatever the scan of an event calls is in events.cpp or json.h, to inline).

// events.cpp: a trace's JSON text read into c (throws Fallback where it gives it back).
// release: the text is a read-only file mapping, whose pages already scanned may be dropped
// (from this process's memory, not from the page cache) as the scan goes
void read_trace(const char* text, int64_t length, bool release, Columns& c);

}  // namespace dtprof_kineto
