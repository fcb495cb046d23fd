// A trace's JSON text read into Columns (read_trace): the document, its header and its
// traceEvents; each event's kind, by its ph, cat and name; and the fields and args keys of the
// groups it is in. The scan's per-event loop: whatever it calls is here or in json.h,
// so that it all inlines.

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "json.h"
#include "columns.h"

namespace dtprof_kineto {
namespace {

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
    case 12: launch = is(c, "cuda_runtime") || is(c, "mtia_runtime"); break;
    case 15: gpu = is(c, "mtia_ccp_events"); break;
  }
  return gpu ? kGpu : launch ? kLaunch : 0u;
}

class TraceReader : public JsonReader {
 public:
  // release: see read_trace
  TraceReader(const char* text, int64_t len, bool release)
      : JsonReader(text, len), released_(release ? text : nullptr) {}

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

 private:
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
  std::string ph_scratch_, cat_scratch_, name_scratch_;

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
  // from the args object at p_, into a (see Num: filled in place).
  void args_here(Args& a) {
    a = Args();
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
      if (field) number(*field);
      else skip(2);
    });
  }

  // The same, of an args object already passed over (a kind field came after it).
  void args_at(int64_t start, int64_t stop, Args& a) {
    const char* saved = p_;
    p_ = begin_ + start;
    args_here(a);
    if (p_ - begin_ != stop) fail("args changed under the scan");
    p_ = saved;
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
    return n.integral ? static_cast<double>(n.i) : n.d;  // correctly rounded, as float(int)
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
        case kPh: text(ph_scratch_, ph); break;
        case kCat: text(cat_scratch_, cat); break;
        case kName: text(name_scratch_, name); break;
        case kPid: number(pid); break;
        case kTid: number(tid); break;
        case kTs: number(ts); break;
        case kDur: number(dur); break;
        case kArgs:
          args_object = peek() == '{';
          args_start = p_ - begin_;
          // In the usual order (args last) the event's kind is known here, and its args are
          // read in passing. Otherwise, or if a kind field repeated after them (the last
          // counts) makes the event one that reads args, they are read again at the end.
          args_read = args_object && (kind_of(ph, cat, name) & kArgsRead);
          if (args_read) {
            args_here(a);
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
    else if ((kind & kArgsRead) && !args_read) args_at(args_start, args_stop, a);
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

}  // namespace

void read_trace(const char* text, int64_t length, bool release, Columns& c) {
  TraceReader(text, length, release).document(c);
}

}  // namespace dtprof_kineto
