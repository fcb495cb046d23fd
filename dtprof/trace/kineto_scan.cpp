// One PyTorch profiler (Kineto) trace, scanned into the columns dtprof's importer maps.
//
// The native form of dtprof/trace/kineto.py's reading (kineto_native.py loads it). It keeps
// exactly the events and fields that read_kineto() keeps, in the same order, with the same
// defaults. It takes only files it reads with certainty: anything unusual (a value of an
// unexpected type, a lone surrogate, invalid UTF-8, invalid JSON, a second traceEvents) makes
// it give the file back ("fallback"), and the Python reader then reads it or says what is wrong.
// After the scan, the same call works out what dtprof/trace/kineto_map.py derives from those
// columns (Mapped: the GPU events' categories and launches, the steps, the samples and the
// collectives), by the same rules, and leaves to it whatever it cannot follow exactly.
// Plain C ABI for ctypes: the scan runs without Python, so ctypes lets other threads run.

#include <fcntl.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if !defined(DTPROF_NO_ZLIB) && __has_include(<zlib.h>)
#include <zlib.h>
#define DTPROF_ZLIB 1  // gzipped files inflated here (the build links -lz)
#endif

#include <algorithm>
#include <charconv>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

extern "C" void* dtprof_kineto_scan(const char* text, int64_t length, int release);

namespace {

constexpr int kMaxDepth = 512;

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

// An optional JSON value of the kinds the importer reads.
struct Num {
  bool present = false;  // false: missing or null (the Python reader's None)
  bool odd = false;      // a value the Python reader would convert some other way
  bool integral = false;
  int64_t i = 0;
  double d = 0.0;
};

struct Str {
  bool present = false;
  std::string_view s;
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
bool is_step(std::string_view n) {
  if (!starts(n, "ProfilerStep")) return false;
  size_t i = sizeof("ProfilerStep") - 1;
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (i < n.size() && space(n[i])) ++i;
  if (i >= n.size() || n[i] != '#') return false;
  ++i;
  while (i < n.size() && space(n[i])) ++i;
  return i < n.size() && n[i] >= '0' && n[i] <= '9';
}

// The N of a ProfilerStep#N name (is_step's rule: the digits after '#'): false where they are
// past int64 (Python then refuses the file).
bool step_number(std::string_view n, int64_t& out) {
  const size_t at = n.find('#');
  size_t i = at + 1;
  while (i < n.size() && (n[i] == ' ' || (n[i] >= '\t' && n[i] <= '\r'))) ++i;
  size_t end = i;
  while (end < n.size() && n[end] >= '0' && n[end] <= '9') ++end;
  auto done = std::from_chars(n.data() + i, n.data() + end, out);
  return done.ec == std::errc() && done.ptr == n.data() + end;
}

bool is_comm_annotation(std::string_view n) {
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

enum Key { kOther, kPh, kCat, kName, kPid, kTid, kTs, kDur, kArgs };

Key event_key(std::string_view k) {
  switch (k.size()) {
    case 2:
      if (is(k, "ph")) return kPh;
      if (is(k, "ts")) return kTs;
      break;
    case 3:
      if (is(k, "cat")) return kCat;
      if (is(k, "pid")) return kPid;
      if (is(k, "tid")) return kTid;
      if (is(k, "dur")) return kDur;
      break;
    case 4:
      if (is(k, "name")) return kName;
      if (is(k, "args")) return kArgs;
      break;
  }
  return kOther;
}

enum Kind : unsigned { kGpu = 1, kLaunch = 2, kCpu = 4, kComm = 8, kMemory = 16 };
constexpr unsigned kArgsRead = kGpu | kLaunch | kMemory;  // the groups that read args keys

// The group an X event's category puts it in: kGpu, kLaunch or 0 (by length first).
unsigned category_kind(std::string_view c) {
  bool gpu = false, launch = false;
  switch (c.size()) {
    case 6:
      gpu = is(c, "kernel") || is(c, "Kernel") || is(c, "Memcpy") || is(c, "Memset");
      launch = is(c, "Driver");
      break;
    case 7: launch = is(c, "Runtime"); break;
    case 10: gpu = is(c, "gpu_memcpy") || is(c, "gpu_memset"); break;
    case 11: launch = is(c, "cuda_driver"); break;
    case 12: launch = is(c, "cuda_runtime"); break;
  }
  return gpu ? kGpu : launch ? kLaunch : 0u;
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

class Scanner {
 public:
  // release: the text is a read-only file mapping, whose pages already scanned may be dropped
  // (from this process's memory, not from the page cache) as the scan goes
  Scanner(const char* text, int64_t len, bool release)
      : begin_(text), p_(text), end_(text + len), released_(release ? text : nullptr) {}

  void document(Columns& c) {
    ws();
    bool events_seen = false;
    members([&](std::string_view key) {
      int header = key == "schemaVersion" ? 0 : key == "distributedInfo" ? 1
                 : key == "baseTimeNanoseconds" ? 2 : -1;
      if (key == "traceEvents") {
        if (events_seen) fail("traceEvents twice");
        events_seen = true;
        events(c);
      } else if (header >= 0) {
        const char* start = p_;
        skip(1);
        header_text[header].assign(start, p_ - start);
        header_seen[header] = true;
      } else {
        skip(1);
      }
    });
    ws();
    if (p_ != end_) fail("something after the trace object");
    if (!events_seen) fail("no traceEvents list");
    for (int k = 0; k < 3; ++k) c.header.add(header_text[k], header_seen[k]);
  }

  // A collective's args object (the text is one, checked by the scan): the last of a repeated
  // key counts, as in the Python reader.
  CommArgs comm_args() {
    CommArgs a;
    ws();
    members([&](std::string_view key) {
      if (is(key, "Collective name")) {
        a.name = text_value(a.name_s, a.odd, true);
      } else if (is(key, "dtype")) {
        a.dtype = text_value(a.dtype_s, a.odd, false);
      } else if (is(key, "Process Group Name")) {
        a.group = text_value(a.group_s, a.odd, true);
      } else if (is(key, "pg_name")) {
        a.pg_name = text_value(a.pg_name_s, a.odd, true);
      } else if (is(key, "In msg nelems")) {
        a.nelems = int_value(a.nelems_i, a.odd);
      } else if (is(key, "Seq") || is(key, "seq")) {
        const int k = key[0] == 'S' ? 0 : 1;
        a.seq[k] = int_value(a.seq_i[k], a.odd);
      } else if (is(key, "Input Dims")) {
        a.dims = true;
        a.dims_count = first_count(a.dims_count_i, a.odd);
      } else if (is(key, "Input type")) {
        a.types = true;
        a.first_type = first_string(a.first_type_s, a.odd);
      } else {
        skip(1);
      }
    });
    ws();
    if (p_ != end_) fail("args changed under the scan");
    return a;
  }

 private:
  const char* begin_;
  const char* p_;
  const char* end_;
  const char* released_;  // null: never release
  std::string header_text[3];
  bool header_seen[3] = {false, false, false};

  static constexpr int64_t kReleaseBytes = 8 << 20;

  void release_scanned() {
    if (!released_ || p_ - released_ < kReleaseBytes) return;
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    uintptr_t lo = (reinterpret_cast<uintptr_t>(released_) + page - 1) & ~(page - 1);
    uintptr_t hi = reinterpret_cast<uintptr_t>(p_) & ~(page - 1);
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    released_ = p_;
  }
  std::string key_scratch_, ph_scratch_, cat_scratch_, name_scratch_;

  [[noreturn]] void fail(const char* why) const { throw Fallback{why, p_ - begin_}; }

  char peek() const { return p_ < end_ ? *p_ : '\0'; }

  // Whitespace passed: none (compact JSON), or the profiler's line breaks and indents 16 bytes
  // at a time (one compare per kind of space, instead of four a byte).
  void ws() {
    const char* q = p_;
    if (q < end_ && static_cast<unsigned char>(*q) > ' ') return;
#ifdef __SSE2__
    while (end_ - q >= 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
      const __m128i space = _mm_cmpeq_epi8(v, _mm_set1_epi8(' '));
      const __m128i line = _mm_cmpeq_epi8(v, _mm_set1_epi8('\n'));
      const __m128i ret = _mm_cmpeq_epi8(v, _mm_set1_epi8('\r'));
      const __m128i tab = _mm_cmpeq_epi8(v, _mm_set1_epi8('\t'));
      const __m128i blank = _mm_or_si128(_mm_or_si128(space, line), _mm_or_si128(ret, tab));
      const unsigned solid = ~static_cast<unsigned>(_mm_movemask_epi8(blank)) & 0xFFFFu;
      if (solid) {
        p_ = q + __builtin_ctz(solid);
        return;
      }
      q += 16;
    }
#endif
    while (q < end_ && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t')) ++q;
    p_ = q;
  }

  // The usual separators, "c" or "c ", then a non-space: passed at once (false: not so).
  __attribute__((always_inline)) bool sep(char c) {
    if (end_ - p_ < 3 || p_[0] != c) return false;
    auto solid = [](char x) { return static_cast<unsigned char>(x) > ' '; };
    if (solid(p_[1])) {
      p_ += 1;
      return true;
    }
    if (p_[1] == ' ' && solid(p_[2])) {
      p_ += 2;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (p_ >= end_ || *p_ != c) fail("invalid JSON");
    ++p_;
  }

  // A string's content: a view into the text, or its unescaped copy in scratch. Valid UTF-8.
  std::string_view string(std::string& scratch) { return any_string<true>(scratch); }

  void skip_string() { any_string<false>(key_scratch_); }

  // Short plain strings (most keys and values) are read here, the rest by string_impl.
  template <bool kKeep>
  __attribute__((always_inline)) std::string_view any_string(std::string& scratch) {
#ifdef __SSE2__
    if (end_ - p_ > 16 && *p_ == '"') {
      int stop = plain_mask(p_ + 1);
      if (stop) {
        int n = __builtin_ctz(static_cast<unsigned>(stop));
        if (p_[1 + n] == '"') {
          const char* start = p_ + 1;
          p_ = start + n + 1;
          return std::string_view(start, static_cast<size_t>(n));
        }
      }
    }
#endif
    return string_impl<kKeep>(scratch);
  }

  template <bool kKeep>
  std::string_view string_impl(std::string& scratch) {
    expect('"');
    const char* start = p_;
    bool copied = false;  // escapes seen: the content is in scratch from then on
    while (true) {
      const char* run = p_;
      p_ = plain_ascii(p_, end_);
      if (kKeep && copied) scratch.append(run, p_ - run);
      if (p_ >= end_) fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        if (!kKeep) return std::string_view();
        return copied ? std::string_view(scratch) : std::string_view(start, p_ - 1 - start);
      }
      if (c < 0x20) fail("control character in a string");
      if (c >= 0x80) {
        const char* seq = p_;
        p_ += utf8_length(p_, end_);
        if (kKeep && copied) scratch.append(seq, p_ - seq);
        continue;
      }
      // a backslash
      if (kKeep && !copied) {
        scratch.assign(start, p_ - start);
        copied = true;
      }
      if (++p_ >= end_) fail("unterminated string");
      char e = *p_++;
      char out;
      switch (e) {
        case '"': out = '"'; break;
        case '\\': out = '\\'; break;
        case '/': out = '/'; break;
        case 'b': out = '\b'; break;
        case 'f': out = '\f'; break;
        case 'n': out = '\n'; break;
        case 'r': out = '\r'; break;
        case 't': out = '\t'; break;
        case 'u': {
          unsigned v = code_point();
          if (kKeep) utf8(scratch, v);
          continue;
        }
        default: fail("invalid escape in a string");
      }
      if (kKeep) scratch.push_back(out);
    }
  }

#ifdef __SSE2__
  // Of the 16 bytes at p, those a plain ASCII run stops at: '"', backslash, control or
  // non-ASCII (a bit each).
  static int plain_mask(const char* p) {
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // signed compare: bytes below 0x20 and those from 0x80 (negative) both stop
    __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                _mm_cmpgt_epi8(space, v));
    return _mm_movemask_epi8(stop);
  }
#endif

  // Past plain ASCII: the first '"', backslash, control or non-ASCII byte, or end.
  static const char* plain_ascii(const char* p, const char* end) {
#ifdef __SSE2__
    while (end - p >= 16) {
      int mask = plain_mask(p);
      if (mask) return p + __builtin_ctz(static_cast<unsigned>(mask));
      p += 16;
    }
#endif
    while (p < end) {
      unsigned char c = static_cast<unsigned char>(*p);
      if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) return p;
      ++p;
    }
    return p;
  }

  // The length of the strict UTF-8 sequence at p (no overlongs, surrogates or past U+10FFFF).
  size_t utf8_length(const char* p, const char* end) const {
    const unsigned char* u = reinterpret_cast<const unsigned char*>(p);
    unsigned char c = u[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      fail("invalid UTF-8");
    }
    if (static_cast<size_t>(end - p) < len) fail("invalid UTF-8");
    if (u[1] < lo || u[1] > hi) fail("invalid UTF-8");
    for (size_t k = 2; k < len; ++k)
      if (u[k] < 0x80 || u[k] > 0xBF) fail("invalid UTF-8");
    return len;
  }

  unsigned hex4() {
    if (end_ - p_ < 4) fail("unterminated string");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = *p_++;
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else fail("invalid \\u escape");
    }
    return v;
  }

  unsigned code_point() {
    unsigned v = hex4();
    if (v >= 0xDC00 && v <= 0xDFFF) fail("lone surrogate");
    if (v >= 0xD800 && v <= 0xDBFF) {
      if (end_ - p_ < 6 || p_[0] != '\\' || p_[1] != 'u') fail("lone surrogate");
      p_ += 2;
      unsigned low = hex4();
      if (low < 0xDC00 || low > 0xDFFF) fail("lone surrogate");
      v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
    }
    if (v == 0) fail("NUL in a string");
    return v;
  }

  static void utf8(std::string& out, unsigned v) {
    if (v < 0x80) {
      out.push_back(static_cast<char>(v));
    } else if (v < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (v >> 6)));
      out.push_back(static_cast<char>(0x80 | (v & 0x3F)));
    } else if (v < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (v >> 12)));
      out.push_back(static_cast<char>(0x80 | ((v >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (v & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (v >> 18)));
      out.push_back(static_cast<char>(0x80 | ((v >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((v >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (v & 0x3F)));
    }
  }

  // Whether the 8 bytes at q are all ASCII digits, and if so their value (in one go: the
  // usual SWAR reduction of digit pairs, then quads, then the eight).
  static bool eight_digits(const char* q, uint64_t& value) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t w;
    std::memcpy(&w, q, 8);
    constexpr uint64_t kHigh = 0xF0F0F0F0F0F0F0F0ull;
    if (((w & kHigh) | (((w + 0x0606060606060606ull) & kHigh) >> 4)) != 0x3333333333333333ull)
      return false;
    w -= 0x3030303030303030ull;
    w = (w * 10 + (w >> 8)) & 0x00FF00FF00FF00FFull;        // 4 pairs, first digit high
    w = (w * 100 + (w >> 16)) & 0x0000FFFF0000FFFFull;      // 2 quads
    value = (w * 10000 + (w >> 32)) & 0xFFFFFFFFull;         // the eight
    return true;
#else
    (void)q;
    (void)value;
    return false;
#endif
  }

  // A JSON number (its grammar checked), p_ past it: integers exactly while they fit int64.
  // The digits are read through a local pointer: a loop that advanced the member p_ would
  // store it back at every digit. kConvert false: a number skipped, its grammar checked only.
  template <bool kConvert = true>
  Num number_value() {
    Num n;
    n.present = true;
    const char* const start = p_;
    const char* q = p_;
    const char* const end = end_;
    auto digit = [&] { return q < end && static_cast<unsigned char>(*q - '0') < 10; };
    bool negative = q < end && *q == '-';
    if (negative) ++q;
    uint64_t magnitude = 0;
    const char* digits = q;
    if (q < end && *q == '0') {
      ++q;
    } else if (!kConvert) {
      if (!digit()) {
        p_ = q;
        fail("invalid JSON");
      }
      while (digit()) ++q;
    } else if (digit()) {
      uint64_t eight;
      while (end - q >= 8 && eight_digits(q, eight)) {
        magnitude = magnitude * 100000000u + eight;  // wraps only past 19 digits (not fits)
        q += 8;
      }
      while (digit()) magnitude = magnitude * 10 + static_cast<unsigned>(*q++ - '0');
    } else {
      p_ = q;
      fail("invalid JSON");
    }
    bool fits = q - digits <= 19;  // 19 digits never wrap a uint64
    n.integral = true;
    if (q < end && *q == '.') {
      n.integral = false;
      ++q;
      if (!digit()) {
        p_ = q;
        fail("invalid number");
      }
      while (digit()) ++q;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
      n.integral = false;
      ++q;
      if (q < end && (*q == '+' || *q == '-')) ++q;
      if (!digit()) {
        p_ = q;
        fail("invalid number");
      }
      while (digit()) ++q;
    }
    p_ = q;
    if constexpr (!kConvert) return n;
    constexpr uint64_t kMax = static_cast<uint64_t>(INT64_MAX);
    if (n.integral && fits && magnitude <= kMax + (negative ? 1 : 0)) {
      n.i = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
      n.d = static_cast<double>(n.i);  // correctly rounded, as Python's float(int)
      return n;
    }
    if (n.integral) n.odd = true;  // past int64: Python keeps it exact
    auto r = std::from_chars(start, p_, n.d);
    if (r.ec != std::errc() || r.ptr != p_ || !std::isfinite(n.d)) fail("number out of range");
    return n;
  }

  // A value read as a number: numbers, null; anything else is odd (and skipped).
  Num number() {
    char c = peek();
    if (c == 'n') {
      literal("null");
      return Num();
    }
    if (c != '-' && !(c >= '0' && c <= '9')) {
      Num n;
      n.present = n.odd = true;
      skip(1);
      return n;
    }
    return number_value();
  }

  // A value read as a string: strings, null; anything else fails (the Python reader decides).
  Str text(std::string& scratch) {
    Str s;
    if (peek() == 'n') {
      literal("null");
      return s;
    }
    if (peek() != '"') fail("a string field holds something else");
    s.present = true;
    s.s = string(scratch);
    return s;
  }

  // A value read as a string: kValue with the string, kNone for null; anything else kOther,
  // or odd where only a string is followed (str() of another kind is Python's own).
  CommArgs::State text_value(std::string& out, bool& odd, bool only_strings) {
    const char c = peek();
    if (c == 'n') {
      literal("null");
      return CommArgs::kNone;
    }
    if (c != '"') {
      skip(1);
      odd = odd || only_strings;
      return CommArgs::kOther;
    }
    std::string scratch;
    out.assign(string(scratch));
    return CommArgs::kValue;
  }

  // A value read as an integer: kValue for one that fits int64, kNone for null, kOther for
  // another kind; odd for a bool (Python counts it an int) or an integer past int64.
  CommArgs::State int_value(int64_t& out, bool& odd) {
    const char c = peek();
    if (c == 't' || c == 'f') {
      skip(1);
      odd = true;
      return CommArgs::kOther;
    }
    Num n = number();
    if (!n.present) return CommArgs::kNone;
    const bool number_read = c == '-' || (c >= '0' && c <= '9');
    if (number_read && n.integral && !n.odd) {
      out = n.i;
      return CommArgs::kValue;
    }
    if (number_read && n.integral) odd = true;  // past int64
    return CommArgs::kOther;
  }

  // "Input Dims": kValue where it is a list whose first element is a list, with the count of
  // that input's elements (their product where all are integers, else 0), else kOther; odd
  // for bools among them (Python counts them ints), negative ones or a count past 2^62.
  CommArgs::State first_count(int64_t& out, bool& odd) {
    if (peek() != '[') {
      skip(1);
      return CommArgs::kOther;
    }
    CommArgs::State state = CommArgs::kOther;
    bool first = true;
    elements([&] {
      if (!first || peek() != '[') {
        first = false;
        skip(2);
        return;
      }
      first = false;
      bool integers = true;
      int64_t count = 1;
      elements([&] {
        const char c = peek();
        if (c == 't' || c == 'f') {
          skip(3);
          odd = true;
          return;
        }
        Num n = number();
        const bool read = c == '-' || (c >= '0' && c <= '9');
        if (!(read && n.integral)) {  // null, a fraction, a string, a list: no count
          integers = false;
          return;
        }
        if (n.odd || n.i < 0 || (count && n.i > (int64_t{1} << 62) / count)) {
          odd = true;
          return;
        }
        count *= n.i;
      });
      out = integers ? count : 0;
      state = CommArgs::kValue;
    });
    return state;
  }

  // "Input type": its first element where it is a list (kValue: "" for an empty list), else
  // kOther; odd where that first element is no string.
  CommArgs::State first_string(std::string& out, bool& odd) {
    if (peek() != '[') {
      skip(1);
      return CommArgs::kOther;
    }
    bool first = true;
    out.clear();
    elements([&] {
      if (first && peek() == '"') {
        std::string scratch;
        out.assign(string(scratch));
      } else {
        if (first) odd = true;
        skip(2);
      }
      first = false;
    });
    return CommArgs::kValue;
  }

  template <size_t N>
  void literal(const char (&word)[N]) {
    constexpr size_t n = N - 1;
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, word, n) != 0) fail("invalid JSON");
    p_ += n;
  }

  // The comma-separated items between open and close: item() reads each one (p_ at it).
  template <typename Item>
  void items(char open, char close, Item&& item) {
    expect(open);
    ws();
    if (peek() == close) {
      ++p_;
      return;
    }
    while (true) {
      item();
      if (sep(',')) continue;
      ws();
      if (peek() == ',') {
        ++p_;
        ws();
        continue;
      }
      expect(close);
      return;
    }
  }

  // An object's members: member(key) reads each value (p_ at it). Keys share key_scratch_, so
  // a key is read before its value is.
  template <typename Member>
  void members(Member&& member) {
    items('{', '}', [&] {
      std::string_view key = string(key_scratch_);
      if (!sep(':')) {
        ws();
        expect(':');
        ws();
      }
      member(key);
    });
  }

  // An array's elements: element() reads each one (p_ at it).
  template <typename Element>
  void elements(Element&& element) {
    items('[', ']', element);
  }

  void skip(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    char c = peek();
    if (c == '"') {
      skip_string();
    } else if (c == '{') {
      members([&](std::string_view) { skip(depth + 1); });
    } else if (c == '[') {
      elements([&] { skip(depth + 1); });
    } else if (c == 't') {
      literal("true");
    } else if (c == 'f') {
      literal("false");
    } else if (c == 'n') {
      literal("null");
    } else {
      number_value<false>();
    }
  }

  void events(Columns& c) {
    elements([&] {
      event(c);
      ++c.events;
      release_scanned();
    });
  }

  struct Args {
    Num stream, correlation, bytes, device_type, total_allocated, total_reserved;
  };

  // The args keys the groups read (the last of a repeated key, as the Python reader takes it),
  // from the args object at p_.
  Args args_here() {
    Args a;
    members([&](std::string_view key) {
      Num* field = nullptr;
      switch (key.size()) {  // by length first: most keys are none of these
        case 5: if (is(key, "bytes")) field = &a.bytes; break;
        case 6: if (is(key, "stream")) field = &a.stream; break;
        case 11:
          if (is(key, "correlation")) field = &a.correlation;
          else if (is(key, "Device Type")) field = &a.device_type;
          break;
        case 14: if (is(key, "Total Reserved")) field = &a.total_reserved; break;
        case 15: if (is(key, "Total Allocated")) field = &a.total_allocated; break;
      }
      if (field) *field = number();
      else skip(2);
    });
    return a;
  }

  // The same, of an args object already passed over (a kind field came after it).
  Args args_at(int64_t start, int64_t stop) {
    const char* saved = p_;
    p_ = begin_ + start;
    Args a = args_here();
    if (p_ - begin_ != stop) fail("args changed under the scan");
    p_ = saved;
    return a;
  }

  // Which groups an event belongs to, by its ph, cat and name (0: none).
  static unsigned kind_of(const Str& ph, const Str& cat, const Str& name) {
    if (!ph.present || ph.s.size() != 1) return 0;
    std::string_view n = name.present ? name.s : std::string_view();
    if (ph.s[0] == 'i') return is(n, "[memory]") ? static_cast<unsigned>(kMemory) : 0u;
    if (ph.s[0] != 'X') return 0;
    unsigned kind = cat.present ? category_kind(cat.s) : 0u;
    if (name.present && (is(n, "record_param_comms") || is_comm_annotation(n)))
      kind |= kCpu | kComm;
    else if ((cat.present && is(cat.s, "user_annotation")) || (name.present && is_step(n)))
      kind |= kCpu;
    return kind;
  }

  // An int64 column's value: the Python reader's default for missing or null.
  int64_t integer(const Num& n, int64_t missing) const {
    if (!n.present) return missing;
    if (n.odd || !n.integral) throw Fallback{"a non-integer where an integer is read", p_ - begin_};
    return n.i;
  }

  double real(const Num& n, double missing) const {
    if (!n.present) return missing;
    if (n.odd) throw Fallback{"a non-number where a number is read", p_ - begin_};
    return n.d;
  }

  // An event's columns in the group it belongs to (an event may be in both). Inlined by force:
  // called, the scan ran 5% more instructions.
  __attribute__((always_inline)) void common(Group& g, std::string_view name, const Str& cat,
                                             const Num& ts, const Num& dur, const Num& pid,
                                             const Num& tid) const {
    g.name.add(name, true);
    g.cat.add(cat.s, cat.present);
    g.ts.push_back(real(ts, 0.0));
    g.dur.push_back(real(dur, 0.0));
    g.pid.push_back(integer(pid, -1));
    g.tid.push_back(integer(tid, -1));
  }

  void event(Columns& c) {
    if (peek() != '{') fail("an event that is not an object");
    Str ph, cat, name;
    Num pid, tid, ts, dur;
    int64_t args_start = -1, args_stop = -1;
    bool args_object = false, args_read = false;  // args_read: `a` holds the last args
    Args a;
    members([&](std::string_view key) {
      switch (event_key(key)) {
        case kPh: ph = text(ph_scratch_); break;
        case kCat: cat = text(cat_scratch_); break;
        case kName: name = text(name_scratch_); break;
        case kPid: pid = number(); break;
        case kTid: tid = number(); break;
        case kTs: ts = number(); break;
        case kDur: dur = number(); break;
        case kArgs:
          args_object = peek() == '{';
          args_start = p_ - begin_;
          // In the usual order (args last) the event's kind is known here, and its args are
          // read in passing. Otherwise, or if a kind field repeated after them (the last
          // counts) makes the event one that reads args, they are read again at the end.
          args_read = args_object && (kind_of(ph, cat, name) & kArgsRead);
          if (args_read) {
            a = args_here();
          } else {
            skip(2);
          }
          args_stop = p_ - begin_;
          break;
        default: skip(2);
      }
    });
    unsigned kind = kind_of(ph, cat, name);
    if (!kind) return;
    std::string_view n = name.present ? name.s : std::string_view();
    if (!args_object) a = Args();  // the last args are no object: none of their keys count
    else if ((kind & kArgsRead) && !args_read) a = args_at(args_start, args_stop);
    if (kind & kGpu) {
      common(c.gpu, n, cat, ts, dur, pid, tid);
      c.gpu_stream.push_back(integer(a.stream, -1));
      c.gpu_correlation.push_back(integer(a.correlation, -1));
      c.gpu_bytes.push_back(integer(a.bytes, -1));
    }
    if (kind & kLaunch) {
      c.launch_ts.push_back(real(ts, 0.0));
      c.launch_tid.push_back(integer(tid, -1));
      c.launch_correlation.push_back(integer(a.correlation, -1));
    }
    if (kind & kCpu) {
      common(c.cpu, n, cat, ts, dur, pid, tid);
      bool keep = (kind & kComm) && args_object;
      c.cpu_args.add(keep ? std::string_view(begin_ + args_start, args_stop - args_start)
                          : std::string_view(),
                     keep);
    }
    if (kind & kMemory) {
      c.memory_ts.push_back(real(ts, 0.0));
      c.memory_device_type.push_back(integer(a.device_type, 0));
      c.memory_allocated.push_back(real(a.total_allocated, NAN));
      c.memory_reserved.push_back(real(a.total_reserved, NAN));
    }
  }
};

// kineto.ns_from_us for one stamp: false when past int64 ns (year 2261), or NaN. The same
// float operations as numpy's (floor; rint, which rounds half to even, as nearbyint does).
bool ns_from_us(double us, int64_t& out) {
  if (!(std::fabs(us) < 9.2e15)) return false;
  const double whole = std::floor(us);
  const double fraction_ns = std::nearbyint((us - whole) * 1000.0);
  out = static_cast<int64_t>(whole) * 1000 + static_cast<int64_t>(fraction_ns);
  return true;
}

enum class Category : int64_t { kCompute, kCommunication, kMemory, kOther };  // kineto_map's

// kineto_map.kernel_category for one name (a null name: compute): the rules in that order,
// later ones winning. "^nccl.*Kernel": "Kernel" after "nccl" with no line break between.
Category name_category(std::string_view n) {
  Category out = Category::kCompute;
  if (n.find("Memcpy") != n.npos || n.find("Sync") != n.npos) out = Category::kOther;
  if (starts(n, "Memcpy") || starts(n, "Memset") || starts(n, "dma")) out = Category::kMemory;
  if (starts(n, "nccl")) {
    std::string_view rest = n.substr(4);
    rest = rest.substr(0, rest.find('\n'));
    if (rest.find("Kernel") != rest.npos) out = Category::kCommunication;
  }
  return out;
}

bool memory_category(std::string_view c) {
  return is(c, "gpu_memcpy") || is(c, "gpu_memset") || is(c, "Memcpy") || is(c, "Memset");
}

// kineto_native.read's stamps of a group: each event's start and end (start + its duration,
// none below 0) in ns. False where one is out of range.
bool group_ns(const Group& g, std::vector<int64_t>& ts_ns, std::vector<int64_t>& end_ns) {
  const size_t n = g.ts.size();
  ts_ns.resize(n);
  end_ns.resize(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t dur;
    if (!ns_from_us(g.ts[i], ts_ns[i]) || !ns_from_us(g.dur[i], dur)) return false;
    end_ns[i] = ts_ns[i] + std::max<int64_t>(dur, 0);
  }
  return true;
}

std::string_view view(const Strings& s, size_t i) {
  return std::string_view(s.data.data() + s.offsets[i], s.offsets[i + 1] - s.offsets[i]);
}

// kineto_native.read's stamps and kineto_map's kernel_category and gpu_launches, for the GPU
// events (see Mapped).
void map_gpu(const Columns& c, Mapped& m) {
  const Group& g = c.gpu;
  const size_t n = g.ts.size();
  if (!group_ns(g, m.gpu_ts_ns, m.gpu_end_ns)) return;
  m.launch_ts_ns.resize(c.launch_ts.size());
  for (size_t i = 0; i < c.launch_ts.size(); ++i)
    if (!ns_from_us(c.launch_ts[i], m.launch_ts_ns[i])) return;

  std::unordered_map<std::string_view, Category> by_name;  // a trace repeats few names
  m.gpu_category.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Category category = Category::kCompute;
    if (g.name.valid[i]) {
      std::string_view name = view(g.name, i);
      auto found = by_name.find(name);
      category = found != by_name.end() ? found->second : by_name[name] = name_category(name);
    }
    const bool memory = g.cat.valid[i] && memory_category(view(g.cat, i));
    if (memory && category != Category::kCommunication) category = Category::kMemory;
    m.gpu_category[i] = static_cast<int64_t>(category);
  }

  // the launches that have a correlation id, by it (ties in file order), searched for each
  // GPU event's: where none has it, the nearest one's thread, as numpy's searchsorted gives
  std::vector<size_t> order;
  for (size_t k = 0; k < c.launch_correlation.size(); ++k)
    if (c.launch_correlation[k] >= 0) order.push_back(k);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return c.launch_correlation[a] < c.launch_correlation[b];
  });
  m.launch_found.assign(n, 0);
  m.launch_at_ns.assign(n, 0);
  m.launch_at_tid.assign(n, -1);
  if (!order.empty()) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t want = c.gpu_correlation[i];
      auto at = std::lower_bound(order.begin(), order.end(), want, [&](size_t k, int64_t v) {
        return c.launch_correlation[k] < v;
      });
      if (at == order.end()) --at;
      const size_t k = *at;
      m.launch_found[i] = c.launch_correlation[k] == want;
      m.launch_at_ns[i] = m.launch_found[i] ? m.launch_ts_ns[k] : 0;
      m.launch_at_tid[i] = c.launch_tid[k];
    }
  }
  m.done = true;
}

// kineto_map._steps: each ProfilerStep#N from the first start to the last end of its
// annotations, in order of start (ties by N). False where a stamp or an N is out of range.
bool map_steps(const Columns& c, Mapped& m) {
  const Group& g = c.cpu;
  const size_t n = g.ts.size();
  if (!group_ns(g, m.cpu_ts_ns, m.cpu_end_ns)) return false;
  std::vector<std::pair<int64_t, size_t>> found;  // (N, event)
  for (size_t i = 0; i < n; ++i) {
    if (!g.name.valid[i] || !is_step(view(g.name, i))) continue;
    int64_t number;
    if (!step_number(view(g.name, i), number)) return false;
    found.emplace_back(number, i);
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t k = 0; k < found.size(); ++k) {
    const size_t i = found[k].second;
    if (k == 0 || found[k].first != found[k - 1].first) {
      m.step_number.push_back(found[k].first);
      m.step_start_ns.push_back(m.cpu_ts_ns[i]);
      m.step_end_ns.push_back(m.cpu_end_ns[i]);
    } else {
      m.step_start_ns.back() = std::min(m.step_start_ns.back(), m.cpu_ts_ns[i]);
      m.step_end_ns.back() = std::max(m.step_end_ns.back(), m.cpu_end_ns[i]);
    }
  }
  std::vector<size_t> by_start(m.step_number.size());
  for (size_t k = 0; k < by_start.size(); ++k) by_start[k] = k;
  std::stable_sort(by_start.begin(), by_start.end(),
                   [&](size_t a, size_t b) { return m.step_start_ns[a] < m.step_start_ns[b]; });
  auto reorder = [&](std::vector<int64_t>& v) {
    std::vector<int64_t> out(v.size());
    for (size_t k = 0; k < v.size(); ++k) out[k] = v[by_start[k]];
    v.swap(out);
  };
  reorder(m.step_number);
  reorder(m.step_start_ns);
  reorder(m.step_end_ns);
  return true;
}

// kineto_map.step_at: the step that began last at or before t; -1 before the first step.
int64_t step_at(const Mapped& m, int64_t t) {
  auto after = std::upper_bound(m.step_start_ns.begin(), m.step_start_ns.end(), t);
  return after == m.step_start_ns.begin() ? -1 : m.step_number[after - m.step_start_ns.begin() - 1];
}

// kineto_map.samples_table: per (step, device), in that order (CPU before CUDA), allocated
// then reserved, the last reading that has the value (readings in time order, ties in file
// order), stamped with the group's last time. False where a stamp is out of range.
bool map_samples(const Columns& c, Mapped& m) {
  const size_t n = c.memory_ts.size();
  std::vector<int64_t> ts(n), key(n);
  for (size_t i = 0; i < n; ++i) {
    if (!ns_from_us(c.memory_ts[i], ts[i])) return false;
    key[i] = step_at(m, ts[i]) * 2 + (c.memory_device_type[i] == 1 ? 1 : 0);
  }
  std::vector<size_t> order(n);  // by group, each group in time order
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ts[a] < ts[b]; });
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] < key[b]; });
  for (int metric = 0; metric < 2; ++metric) {
    const std::vector<double>& values = metric == 0 ? c.memory_allocated : c.memory_reserved;
    for (size_t lo = 0, hi; lo < n; lo = hi) {
      const int64_t group = key[order[lo]];
      for (hi = lo; hi < n && key[order[hi]] == group; ++hi) {
      }
      for (size_t k = hi; k-- > lo;) {  // the group's last reading that has the value
        const double value = values[order[k]];
        if (std::isnan(value)) continue;
        const int64_t device = ((group % 2) + 2) % 2;
        m.sample_step.push_back((group - device) / 2);
        m.sample_ts_ns.push_back(ts[order[hi - 1]]);
        m.sample_metric.push_back(metric * 2 + device);
        m.sample_value.push_back(value);
        break;
      }
    }
  }
  return true;
}

// kineto_map.OP_NAMES, DTYPE_BYTES and P2P_OPS (tests/test_kineto_native.py checks that
// they agree).
const std::unordered_map<std::string_view, std::string_view> kOpNames = {
    {"allreduce", "all_reduce"},
    {"allreduce_coalesced", "all_reduce_coalesced"},
    {"allgather", "all_gather"},
    {"_allgather_base", "all_gather_into_tensor"},
    {"allgather_into_tensor", "all_gather_into_tensor"},
    {"allgather_into_tensor_coalesced", "all_gather_into_tensor_coalesced"},
    {"reducescatter", "reduce_scatter"},
    {"_reduce_scatter_base", "reduce_scatter_tensor"},
    {"reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced"},
    {"alltoall", "all_to_all"},
    {"alltoall_base", "all_to_all_single"},
    {"all_to_allv", "all_to_all_single"},
    {"recvanysource", "recv"},
};
const std::unordered_map<std::string_view, int64_t> kDtypeBytes = {
    {"float", 4}, {"float32", 4}, {"double", 8}, {"float64", 8}, {"half", 2}, {"float16", 2},
    {"c10::half", 2}, {"bfloat16", 2}, {"c10::bfloat16", 2}, {"int", 4}, {"int32", 4},
    {"long", 8}, {"int64", 8}, {"long int", 8}, {"short", 2}, {"int16", 2}, {"char", 1},
    {"signed char", 1}, {"unsigned char", 1}, {"byte", 1}, {"int8", 1}, {"uint8", 1},
    {"bool", 1},
};
bool is_p2p(std::string_view op) {
  return op == "send" || op == "recv" || op == "isend" || op == "irecv" || op == "recvanysource";
}

// s.lower() for ASCII text: false for any other (Python lowers the rest of Unicode too).
bool ascii_lower(std::string_view s, std::string& out) {
  out.assign(s);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return true;
}

// kineto_map._normal_op: after the first ':', stripped of what Python's str.strip() strips
// (ASCII: \t..\r, \x1c..\x1f, space) and lowered; false for non-ASCII names.
bool normal_op(std::string_view name, std::string& out) {
  const size_t colon = name.find(':');
  if (colon != name.npos) name = name.substr(colon + 1);
  auto space = [](char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
  };
  while (!name.empty() && space(name.front())) name.remove_prefix(1);
  while (!name.empty() && space(name.back())) name.remove_suffix(1);
  if (!ascii_lower(name, out)) return false;
  auto found = kOpNames.find(out);
  if (found != kOpNames.end()) out.assign(found->second);
  return true;
}

// kineto_map._size: (bytes, dtype) from "In msg nelems" and "dtype", else from the first
// input's dims and type. False where it cannot follow Python (non-ASCII, a product past int64).
bool comm_size(const CommArgs& a, int64_t& bytes, std::string& dtype, bool& has_dtype) {
  bytes = 0;
  has_dtype = false;
  std::string lower;
  auto per = [](const std::string& t) {
    auto found = kDtypeBytes.find(t);
    return found != kDtypeBytes.end() ? found->second : int64_t{0};
  };
  if (a.nelems == CommArgs::kValue && a.dtype == CommArgs::kValue) {
    if (!ascii_lower(a.dtype_s, lower)) return false;
    if (__builtin_mul_overflow(a.nelems_i, per(lower), &bytes)) return false;
    dtype = lower;
    has_dtype = true;
    return true;
  }
  if (!a.dims || !a.types) return true;
  if (a.dims_count != CommArgs::kValue || a.first_type != CommArgs::kValue) return true;
  if (!ascii_lower(a.first_type_s, lower)) return false;
  if (__builtin_mul_overflow(a.dims_count_i, per(lower), &bytes)) return false;
  dtype = lower;
  has_dtype = !lower.empty();
  return true;
}

// kineto_map.collectives_table's rows (the rules in that module's doc): per thread, its
// record_param_comms by start, then the communication annotations inside none of them; times
// of the communication kernels each launched, else its own; then all by start. False where a
// collective's args hold something the mapping reads in a way not followed here.
bool map_collectives(const Columns& c, Mapped& m) {
  const Group& g = c.cpu;
  const size_t n = g.ts.size();
  std::vector<char> rpc_of(n, 0), ann_of(n, 0);
  std::vector<int64_t> tids;
  for (size_t i = 0; i < n; ++i) {
    if (!g.name.valid[i]) continue;
    std::string_view name = view(g.name, i);
    rpc_of[i] = is(name, "record_param_comms");
    ann_of[i] = is_comm_annotation(name);
    if (rpc_of[i] || ann_of[i]) tids.push_back(g.tid[i]);
  }
  std::sort(tids.begin(), tids.end());
  tids.erase(std::unique(tids.begin(), tids.end()), tids.end());
  std::vector<CommArgs> args(n);  // of the collectives' events (none where no object)
  for (size_t i = 0; i < n; ++i) {
    if (!(rpc_of[i] || ann_of[i]) || !c.cpu_args.valid[i]) continue;
    std::string_view text = view(c.cpu_args, i);
    try {
      args[i] = Scanner(text.data(), static_cast<int64_t>(text.size()), false).comm_args();
    } catch (const Fallback&) {
      return false;
    }
    if (args[i].odd) return false;
  }
  // the communication kernels whose launch is known, each with its launch's thread and time
  std::vector<size_t> comm;
  for (size_t k = 0; k < m.gpu_category.size(); ++k)
    if (m.gpu_category[k] == static_cast<int64_t>(Category::kCommunication) && m.launch_found[k])
      comm.push_back(k);
  struct Row {
    int64_t cpu_ns, start_ns, end_ns, bytes;
    bool gpu, p2p, has_seq, has_dtype;
    int64_t seq;
    std::string group, op, dtype;
  };
  std::vector<Row> rows;
  const CommArgs none;
  auto by_start = [&](std::vector<size_t>& v) {
    std::stable_sort(v.begin(), v.end(),
                     [&](size_t a, size_t b) { return m.cpu_ts_ns[a] < m.cpu_ts_ns[b]; });
  };
  for (int64_t tid : tids) {
    std::vector<size_t> kernels;  // this thread's, by launch time (ties as found)
    for (size_t k : comm)
      if (m.launch_at_tid[k] == tid) kernels.push_back(k);
    std::stable_sort(kernels.begin(), kernels.end(),
                     [&](size_t a, size_t b) { return m.launch_at_ns[a] < m.launch_at_ns[b]; });
    std::vector<int64_t> launch(kernels.size());
    for (size_t k = 0; k < kernels.size(); ++k) launch[k] = m.launch_at_ns[kernels[k]];
    std::vector<size_t> rpc, ann;
    for (size_t i = 0; i < n; ++i) {
      if (g.tid[i] != tid) continue;
      if (rpc_of[i]) rpc.push_back(i);
      if (ann_of[i]) ann.push_back(i);
    }
    by_start(rpc);
    by_start(ann);
    std::vector<int64_t> rpc_start(rpc.size());
    for (size_t j = 0; j < rpc.size(); ++j) rpc_start[j] = m.cpu_ts_ns[rpc[j]];
    std::vector<int64_t> child(rpc.size(), -1);  // the first annotation inside each operator
    std::vector<size_t> outside;
    for (size_t a : ann) {
      auto after = std::upper_bound(rpc_start.begin(), rpc_start.end(), m.cpu_ts_ns[a]);
      const size_t parent = static_cast<size_t>(after - rpc_start.begin());
      if (parent > 0 && m.cpu_ts_ns[a] <= m.cpu_end_ns[rpc[parent - 1]]) {
        if (child[parent - 1] < 0) child[parent - 1] = static_cast<int64_t>(a);
      } else {
        outside.push_back(a);
      }
    }
    // the kernels this thread launched during an event: [lo, hi) of `launch`
    auto launched = [&](size_t event) {
      return std::make_pair(std::lower_bound(launch.begin(), launch.end(), m.cpu_ts_ns[event]),
                            std::upper_bound(launch.begin(), launch.end(), m.cpu_end_ns[event]));
    };
    auto add = [&](size_t event, auto kernels_during, const std::string_view op_name,
                   const CommArgs& own, const CommArgs& sized) -> bool {
      Row r;
      r.cpu_ns = m.cpu_ts_ns[event];
      const auto [lo, hi] = kernels_during;
      r.gpu = hi > lo;
      r.start_ns = m.cpu_ts_ns[event];
      r.end_ns = m.cpu_end_ns[event];
      if (r.gpu) {
        r.start_ns = std::numeric_limits<int64_t>::max();
        r.end_ns = std::numeric_limits<int64_t>::min();
        for (auto k = lo; k < hi; ++k) {
          r.start_ns = std::min(r.start_ns, m.gpu_ts_ns[kernels[k - launch.begin()]]);
          r.end_ns = std::max(r.end_ns, m.gpu_end_ns[kernels[k - launch.begin()]]);
        }
      }
      if (!normal_op(op_name, r.op)) return false;
      r.p2p = is_p2p(r.op);
      if (!comm_size(sized, r.bytes, r.dtype, r.has_dtype)) return false;
      const int k = own.seq[0] != CommArgs::kNone ? 0 : 1;
      r.has_seq = own.seq[k] == CommArgs::kValue;
      r.seq = own.seq_i[k];
      r.group = own.group == CommArgs::kValue ? own.group_s
              : own.pg_name == CommArgs::kValue ? own.pg_name_s : std::string("0");
      rows.push_back(std::move(r));
      return true;
    };
    for (size_t j = 0; j < rpc.size(); ++j) {
      const size_t e = rpc[j];
      const CommArgs& a = args[e];
      const bool named = a.name == CommArgs::kValue && !a.name_s.empty();
      const auto during = launched(e);
      if (!named && child[j] < 0 && !(during.second > during.first)) continue;  // bookkeeping
      const size_t inside = static_cast<size_t>(child[j]);
      std::string_view op = named ? std::string_view(a.name_s)
                          : child[j] >= 0 ? view(g.name, inside) : std::string_view("unknown");
      const bool from_own = a.nelems != CommArgs::kNone || child[j] < 0;
      if (!add(e, during, op, a, from_own ? a : args[inside])) return false;
    }
    for (size_t e : outside)
      if (!add(e, launched(e), view(g.name, e), none, args[e])) return false;
  }
  std::vector<size_t> order(rows.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rows[a].start_ns < rows[b].start_ns; });
  bool all_seq = true;
  std::unordered_map<std::string, int64_t> codes;  // each group, by first appearance
  std::unordered_map<int64_t, int64_t> calls;      // per (group, p2p): the calls so far
  for (size_t k : order) {
    const Row& r = rows[k];
    all_seq = all_seq && r.has_seq;
    auto code = codes.emplace(r.group, static_cast<int64_t>(codes.size())).first->second;
    const int64_t before = calls[code * 2 + (r.p2p ? 1 : 0)]++;
    m.coll_step.push_back(step_at(m, r.cpu_ns));
    m.coll_seq.push_back(r.has_seq ? r.seq : before);
    m.coll_bytes.push_back(r.bytes);
    m.coll_p2p.push_back(r.p2p);
    m.coll_start_ns.push_back(r.start_ns);
    m.coll_end_ns.push_back(r.end_ns);
    m.coll_gpu.push_back(r.gpu);
    m.coll_group.add(r.group, true);
    m.coll_op.add(r.op, true);
    m.coll_dtype.add(r.dtype, r.has_dtype);
  }
  m.coll_seq_from_trace.assign(1, all_seq ? 1 : 0);
  return true;
}

struct Column {
  const char* name;
  const void* data;
  int64_t length;  // elements
};

template <typename T>
Column col(const char* name, const std::vector<T>& v) {
  return {name, v.data(), static_cast<int64_t>(v.size())};
}

void strings(std::vector<Column>& out, const char* offsets, const char* data, const char* valid,
             const Strings& s) {
  out.push_back(col(offsets, s.offsets));
  out.push_back({data, s.data.data(), static_cast<int64_t>(s.data.size())});
  out.push_back(col(valid, s.valid));
}

// A group's column names, "<prefix>_ts" to "<prefix>_cat.valid", in the order group() uses.
std::vector<std::string> group_names(const char* prefix) {
  std::vector<std::string> out;
  for (const char* name : {"_ts", "_dur", "_pid", "_tid", "_name.offsets", "_name.data",
                           "_name.valid", "_cat.offsets", "_cat.data", "_cat.valid"})
    out.push_back(prefix + std::string(name));
  return out;
}

void group(std::vector<Column>& out, const std::vector<std::string>& names, const Group& g) {
  out.push_back(col(names[0].c_str(), g.ts));
  out.push_back(col(names[1].c_str(), g.dur));
  out.push_back(col(names[2].c_str(), g.pid));
  out.push_back(col(names[3].c_str(), g.tid));
  strings(out, names[4].c_str(), names[5].c_str(), names[6].c_str(), g.name);
  strings(out, names[7].c_str(), names[8].c_str(), names[9].c_str(), g.cat);
}

std::vector<Column> columns(const Columns& c, const Mapped& m) {
  // made once and kept: the names' addresses are handed out with the columns
  static const std::vector<std::string> kGpu = group_names("gpu"), kCpu = group_names("cpu");
  std::vector<Column> out{
      col("gpu_stream", c.gpu_stream),
      col("gpu_correlation", c.gpu_correlation),
      col("gpu_bytes", c.gpu_bytes),
      col("launch_ts", c.launch_ts),
      col("launch_tid", c.launch_tid),
      col("launch_correlation", c.launch_correlation),
      col("memory_ts", c.memory_ts),
      col("memory_device_type", c.memory_device_type),
      col("memory_allocated", c.memory_allocated),
      col("memory_reserved", c.memory_reserved),
  };
  group(out, kGpu, c.gpu);
  group(out, kCpu, c.cpu);
  strings(out, "cpu_args.offsets", "cpu_args.data", "cpu_args.valid", c.cpu_args);
  strings(out, "header.offsets", "header.data", "header.valid", c.header);
  if (m.done) {
    for (Column mapped : {col("gpu_ts_ns", m.gpu_ts_ns), col("gpu_end_ns", m.gpu_end_ns),
                          col("launch_ts_ns", m.launch_ts_ns), col("gpu_category", m.gpu_category),
                          col("gpu_launch_found", m.launch_found),
                          col("gpu_launch_ts_ns", m.launch_at_ns),
                          col("gpu_launch_tid", m.launch_at_tid)})
      out.push_back(mapped);
  }
  if (m.steps_done) {
    for (Column mapped : {col("cpu_ts_ns", m.cpu_ts_ns), col("cpu_end_ns", m.cpu_end_ns),
                          col("step_number", m.step_number), col("step_start_ns", m.step_start_ns),
                          col("step_end_ns", m.step_end_ns)})
      out.push_back(mapped);
  }
  if (m.samples_done) {
    for (Column mapped : {col("sample_step", m.sample_step), col("sample_ts_ns", m.sample_ts_ns),
                          col("sample_metric", m.sample_metric),
                          col("sample_value", m.sample_value)})
      out.push_back(mapped);
  }
  if (m.collectives_done) {
    for (Column mapped : {col("coll_step", m.coll_step), col("coll_seq", m.coll_seq),
                          col("coll_bytes", m.coll_bytes), col("coll_p2p", m.coll_p2p),
                          col("coll_start_ns", m.coll_start_ns), col("coll_end_ns", m.coll_end_ns),
                          col("coll_gpu", m.coll_gpu),
                          col("coll_seq_from_trace", m.coll_seq_from_trace)})
      out.push_back(mapped);
    strings(out, "coll_group.offsets", "coll_group.data", "coll_group.valid", m.coll_group);
    strings(out, "coll_op.offsets", "coll_op.data", "coll_op.valid", m.coll_op);
    strings(out, "coll_dtype.offsets", "coll_dtype.data", "coll_dtype.valid", m.coll_dtype);
  }
  return out;
}

void* given_back(const char* why) {
  auto* r = new Result();
  r->status = 1;
  r->why = why;
  return r;
}

#ifdef DTPROF_ZLIB
// Anonymous pages for an inflated text: page-aligned, so that the scan drops them as it goes,
// as it does a file's mapping.
struct Pages {
  char* data = nullptr;
  size_t size = 0;
  ~Pages() {
    if (data) munmap(data, size);
  }
  bool grow(size_t want, size_t used) {
    void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    if (data) {
      std::memcpy(p, data, used);
      munmap(data, size);
    }
    data = static_cast<char*>(p);
    size = want;
    return true;
  }
};

// Inflate a gzipped file (every member, as Python's gzip.decompress does; zlib checks each
// one's CRC and length) into anonymous pages sized by its trailer, then scan the text. What
// is not a clean gzip stream is given back: the Python reader says what is wrong with it.
void* scan_gzipped(int fd, size_t size) {
  if (size > std::numeric_limits<uInt>::max()) return given_back("gzip: over 4 GiB");
  std::string packed(size, '\0');
  for (size_t got = 0; got < size;) {
    ssize_t n = pread(fd, &packed[got], size - got, static_cast<off_t>(got));
    if (n <= 0) return given_back(n < 0 ? std::strerror(errno) : "gzip: file shrank");
    got += static_cast<size_t>(n);
  }
  uint32_t trailer = 0;  // the last member's length mod 2^32: the usual whole length
  if (size >= 4) std::memcpy(&trailer, packed.data() + size - 4, 4);
  Pages text;
  if (!text.grow(static_cast<size_t>(trailer) + 4096, 0)) return given_back(std::strerror(errno));
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return given_back("gzip: zlib failed to start");
  z.next_in = reinterpret_cast<Bytef*>(&packed[0]);
  z.avail_in = static_cast<uInt>(size);
  size_t used = 0;
  const char* why = nullptr;
  while (!why) {
    if (used == text.size && !text.grow(text.size * 2, used)) {
      why = "gzip: out of memory";
      break;
    }
    size_t room = std::min(text.size - used, static_cast<size_t>(std::numeric_limits<uInt>::max()));
    z.next_out = reinterpret_cast<Bytef*>(text.data + used);
    z.avail_out = static_cast<uInt>(room);
    int rc = inflate(&z, Z_NO_FLUSH);
    used += room - z.avail_out;
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) break;  // the last member
      if (z.avail_in < 2 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b) {
        why = "gzip: something after its last member";
      } else if (inflateReset(&z) != Z_OK) {
        why = "gzip: zlib failed to go on";
      }
    } else if (rc != Z_OK && !(rc == Z_BUF_ERROR && z.avail_out == 0)) {
      why = rc == Z_BUF_ERROR ? "gzip: cut short" : "gzip: corrupted";
    } else if (z.avail_in == 0 && z.avail_out > 0) {
      why = "gzip: cut short";
    }
  }
  inflateEnd(&z);
  if (why) return given_back(why);
  std::string().swap(packed);
  return dtprof_kineto_scan(text.data, static_cast<int64_t>(used), 1);
}
#endif

}  // namespace

extern "C" {

// Scan one trace's JSON text; never null, never throws. Free with dtprof_kineto_free.
// release: the text is a read-only file mapping (see Scanner).
void* dtprof_kineto_scan(const char* text, int64_t length, int release) {
  auto* r = new Result();
  try {
    r->cols.expect(length);
    Scanner(text, length, release != 0).document(r->cols);
  } catch (const Fallback& f) {
    r->status = 1;
    r->why = f.why;
    r->at = f.at;
    r->cols = Columns();
  } catch (const std::exception& e) {
    r->status = 1;
    r->why = e.what();
    r->cols = Columns();
  }
  if (r->status == 0) {
    try {
      map_gpu(r->cols, r->mapped);
      Mapped& m = r->mapped;
      m.steps_done = map_steps(r->cols, m);
      m.samples_done = m.steps_done && map_samples(r->cols, m);
      m.collectives_done = m.steps_done && map_collectives(r->cols, m);
    } catch (const std::exception&) {  // out of memory, say: Python maps them
      r->mapped = Mapped();
    }
    if (!r->mapped.done) r->mapped = Mapped();
    if (!r->mapped.steps_done) r->mapped.samples_done = r->mapped.collectives_done = false;
  }
  return r;
}

// Scan one trace file: mapped read-only, its pages dropped once scanned (they stay in the page
// cache). A gzipped file is inflated first (built without zlib: status 2, for the caller to
// inflate and scan as text). Status 1, with the reason, for one that cannot be opened, mapped,
// inflated or read with certainty.
void* dtprof_kineto_scan_file(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return given_back(std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size == 0) {
    const char* why = st.st_size == 0 ? "an empty file" : std::strerror(errno);
    close(fd);
    return given_back(why);
  }
  unsigned char magic[2] = {0, 0};
  if (st.st_size >= 2 && pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
#ifdef DTPROF_ZLIB
    void* r = scan_gzipped(fd, static_cast<size_t>(st.st_size));
    close(fd);
    return r;
#else
    close(fd);
    auto* r = static_cast<Result*>(given_back("gzip"));
    r->status = 2;
    return r;
#endif
  }
  void* text = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (text == MAP_FAILED) return given_back(std::strerror(errno));
  void* r = dtprof_kineto_scan(static_cast<const char*>(text), st.st_size, 1);
  munmap(text, static_cast<size_t>(st.st_size));
  return r;
}

// Whether this build inflates gzipped files itself (else their scans say status 2).
int dtprof_kineto_inflates() {
#ifdef DTPROF_ZLIB
  return 1;
#else
  return 0;
#endif
}

int dtprof_kineto_status(void* result) { return static_cast<Result*>(result)->status; }

const char* dtprof_kineto_why(void* result) { return static_cast<Result*>(result)->why.c_str(); }

int64_t dtprof_kineto_at(void* result) { return static_cast<Result*>(result)->at; }

int64_t dtprof_kineto_events(void* result) { return static_cast<Result*>(result)->cols.events; }

// The result's columns, by name: their count, and each one's name, address and length.
int dtprof_kineto_columns(void* result, const char** names, const void** data, int64_t* lengths,
                          int capacity) {
  auto* r = static_cast<Result*>(result);
  auto cols = columns(r->cols, r->mapped);
  int n = static_cast<int>(cols.size());
  for (int i = 0; i < n && i < capacity; ++i) {
    names[i] = cols[i].name;
    data[i] = cols[i].data;
    lengths[i] = cols[i].length;
  }
  return n;
}

void dtprof_kineto_free(void* result) { delete static_cast<Result*>(result); }

// Give the pages of freed scans back to the system (glibc keeps them for reuse otherwise).
void dtprof_kineto_trim() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}
}
