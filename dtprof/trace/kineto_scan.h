// What the native Kineto reader's files share: the columns a trace is scanned into, what the
// mapping derives from them and the scan's result (Fallback, Strings, Group, Columns, Mapped,
// Result), a collective's args as the mapping reads them (CommArgs), the name tests both the
// scan and the mapping make, and the few calls that cross from one file to another. Hidden:
// nothing declared here is exported from the library, whose interface is kineto_scan.cpp's
// extern "C" functions alone.

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

// Internal to each file that uses it: the standard library's templates instantiated for a type
// of this namespace would otherwise be exported (hidden visibility does not pass to an enum's).
namespace {
enum class Category : int64_t { kCompute, kCommunication, kMemory, kOther };  // kineto_map's
}  // namespace

// What the importer's mapping (dtprof/trace/kineto_map.py) derives from the GPU events and the
// launches alone, worked out here, in the scanning thread, rather than in Python: the GPU
// events' times in ns, each one's category and its CUDA launch. Left undone where a stamp is
// out of range: Python converts the stamps then, and says so.
struct Mapped {
  bool done = false;
  std::vector<int64_t> gpu_ts_ns, gpu_end_ns, launch_ts_ns;
  std::vector<int64_t> gpu_category;  // kernel_map.CATEGORIES' places
  std::vector<int64_t> launch_found, launch_at_ns, launch_at_tid;  // per GPU event
  // kineto_map's steps (by start, ties by number) and samples table, where worked out here
  bool steps_done = false;
  std::vector<int64_t> cpu_ts_ns, cpu_end_ns, step_number, step_start_ns, step_end_ns;
  bool samples_done = false;
  std::vector<int64_t> sample_step, sample_ts_ns, sample_metric;  // metric: kSampleMetrics' place
  std::vector<double> sample_value;
  // kineto_map.collectives_table's rows, where worked out here
  bool collectives_done = false;
  std::vector<int64_t> coll_step, coll_seq, coll_bytes, coll_p2p, coll_start_ns, coll_end_ns;
  std::vector<int64_t> coll_gpu, coll_seq_from_trace;  // the last: one value, 1 or 0
  Strings coll_group, coll_op, coll_dtype;
};

struct Result {
  Columns cols;
  Mapped mapped;
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

// A collective's args (of record_param_comms or of a communication annotation) as the mapping
// reads them (kineto_map._add_args and _size). odd: a value the mapping would read in a way
// not followed here (a number as a string, a bool as an int, ...): the file's collectives are
// then left to Python.
struct CommArgs {
  enum State { kNone, kValue, kOther };  // absent or null; the kind read; present, another kind
  bool odd = false;
  State name = kNone, dtype = kNone, group = kNone, pg_name = kNone, nelems = kNone;
  std::string name_s, dtype_s, group_s, pg_name_s;
  int64_t nelems_i = 0;
  State seq[2] = {kNone, kNone};  // "Seq", then "seq"
  int64_t seq_i[2] = {0, 0};
  bool dims = false, types = false;  // "Input Dims" / "Input type" present (null too)
  State dims_count = kNone;          // the first input's element count, where dims give one
  int64_t dims_count_i = 0;
  State first_type = kNone;          // the first input's type: a string, or "" for no types
  std::string first_type_s;
};

inline std::string_view view(const Strings& s, size_t i) {
  return std::string_view(s.data.data() + s.offsets[i], s.offsets[i + 1] - s.offsets[i]);
}

// The places 0..n-1 in the order less(a, b) gives them, equals in place order: numpy's
// argsort(kind="stable"), which the mapping uses.
template <typename Less>
std::vector<size_t> stable_order(size_t n, Less less) {
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), less);
  return order;
}

// The calls from one file to another: once per trace, or once per collective, never per event
// (whatever the scan of an event calls is in kineto_events.cpp or kineto_json.h, to inline).

// kineto_events.cpp: a trace's JSON text read into c (throws Fallback where it gives it back).
// release: the text is a read-only file mapping, whose pages already scanned may be dropped
// (from this process's memory, not from the page cache) as the scan goes
void read_trace(const char* text, int64_t length, bool release, Columns& c);

// kineto_comm_args.cpp: a collective's args object, as the scan kept its text (throws Fallback).
CommArgs read_comm_args(std::string_view text);

// kineto_map.cpp: the GPU events, the steps and the samples (see Mapped)
void map_gpu(const Columns& c, Mapped& m);
bool map_steps(const Columns& c, Mapped& m);
bool map_samples(const Columns& c, Mapped& m);
int64_t step_at(const Mapped& m, int64_t t);

// kineto_collectives.cpp: the collectives (see Mapped)
bool map_collectives(const Columns& c, Mapped& m);

}  // namespace dtprof_kineto
