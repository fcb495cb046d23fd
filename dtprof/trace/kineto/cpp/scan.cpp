// One PyTorch profiler (Kineto) trace, scanned into the columns dtprof's mapping reads: the
// extension module dtprof.trace.kineto._scan, built at install (setup.py, pybind11).
//
// The native form of dtprof/trace/kineto/read.py's reading (native.py turns its columns into a
// KinetoFile). It keeps exactly the events and fields that read_kineto() keeps, in the same
// order, with the same defaults. It takes only files it reads with certainty: anything unusual
// (a value of an unexpected type, a lone surrogate, invalid UTF-8, invalid JSON, a second
// traceEvents) makes it give the file back ("fallback"), and the Python reader then reads it or
// says what is wrong. What the columns mean for dtprof's tables is worked out in Python
// (mapping.py), for the columns of either reader. Scans run without the GIL.
//
// This file: the module, and the files it reads (mapped, or inflated). The rest, one file each:
// columns.h (the data they share), json.h (the JSON text), events.cpp (the events).

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
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <type_traits>

#include "columns.h"

namespace py = pybind11;

namespace dtprof_kineto {
namespace {

struct Column {
  const char* name;
  const void* data;
  int64_t length;  // elements
  const char* format;  // numpy's: d float64, q int64, i int32, B uint8
};

template <typename T>
Column col(const char* name, const std::vector<T>& v) {
  static_assert(sizeof(T) == 8 || sizeof(T) == 4 || sizeof(T) == 1);
  const char* format = std::is_same_v<T, double> ? "d" : sizeof(T) == 8 ? "q" : sizeof(T) == 4 ? "i" : "B";
  return {name, v.data(), static_cast<int64_t>(v.size()), format};
}

void strings(std::vector<Column>& out, const char* offsets, const char* data, const char* valid,
             const Strings& s) {
  out.push_back(col(offsets, s.offsets));
  out.push_back({data, s.data.data(), static_cast<int64_t>(s.data.size()), "B"});
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

std::vector<Column> columns(const Columns& c) {
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
  return out;
}

Result* given_back(const char* why) {
  auto* r = new Result();
  r->status = 1;
  r->why = why;
  return r;
}

Result* scan_text(const char* text, int64_t length, bool release);

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
Result* scan_gzipped(int fd, size_t size) {
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
  return scan_text(text.data, static_cast<int64_t>(used), true);
}
#endif

// Scan one trace's JSON text; never null, never throws. release: the text is a read-only file
// mapping (see read_trace).
Result* scan_text(const char* text, int64_t length, bool release) {
  auto* r = new Result();
  try {
    r->cols.expect(length);
    read_trace(text, length, release, r->cols);
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
  return r;
}

// Scan one trace file: mapped read-only, its pages dropped once scanned (they stay in the page
// cache). A gzipped file is inflated first (built without zlib: status 2, for the caller to
// inflate and scan as text). Status 1, with the reason, for one that cannot be opened, mapped,
// inflated or read with certainty.
Result* scan_file(const char* path) {
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
    Result* r = scan_gzipped(fd, static_cast<size_t>(st.st_size));
    close(fd);
    return r;
#else
    close(fd);
    Result* r = given_back("gzip");
    r->status = 2;
    return r;
#endif
  }
  void* text = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (text == MAP_FAILED) return given_back(std::strerror(errno));
  Result* r = scan_text(static_cast<const char*>(text), st.st_size, true);
  munmap(text, static_cast<size_t>(st.st_size));
  return r;
}

// The result's columns as numpy arrays that view its memory: each holds the scan object, so
// the memory lives as long as the last of them.
py::dict column_arrays(py::object scan) {
  const Result& r = scan.cast<const Result&>();
  py::dict out;
  for (const Column& c : columns(r.cols)) {
    py::dtype dtype{std::string(c.format)};
    std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(c.length)};
    // an empty column owns its (empty) memory: there is nothing of the scan's to view
    out[c.name] = c.length ? py::array(dtype, shape, {}, c.data, scan) : py::array(dtype, shape);
  }
  return out;
}

}  // namespace

}  // namespace dtprof_kineto

PYBIND11_MODULE(_scan, m) {
  using namespace dtprof_kineto;
  m.doc() = "dtprof's native reader of PyTorch profiler traces (dtprof/trace/kineto/cpp)";
#ifdef DTPROF_ZLIB
  m.attr("inflates") = true;  // gzipped files inflated here; else their scans say status 2
#else
  m.attr("inflates") = false;
#endif
  py::class_<Result>(m, "Scan", "One file's scan: its columns, or why it gave the file back.")
      .def_property_readonly("status", [](const Result& r) { return r.status; },
                             "0: read; 1: given back to the Python reader; 2: gzipped")
      .def_property_readonly("why", [](const Result& r) { return r.why; })
      .def_property_readonly("at", [](const Result& r) { return r.at; },
                             "the byte where it gave the file back, or -1")
      .def_property_readonly("events", [](const Result& r) { return r.cols.events; })
      .def("columns", &column_arrays, "name -> numpy array viewing the scan's memory");
  m.def(
      "scan_file",
      [](const std::string& path) {
        py::gil_scoped_release unlocked;
        return std::unique_ptr<Result>(scan_file(path.c_str()));
      },
      "Scan one trace file (plain or gzipped), without the GIL.");
  m.def(
      "scan_text",
      [](py::buffer text) {
        py::buffer_info info = text.request();
        py::gil_scoped_release unlocked;
        return std::unique_ptr<Result>(scan_text(static_cast<const char*>(info.ptr),
                                                 static_cast<int64_t>(info.size * info.itemsize),
                                                 false));
      },
      "Scan a trace's JSON text (bytes), without the GIL.");
  m.def("trim", [] {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
  }, "Give the pages of freed scans back to the system (glibc keeps them otherwise).");
}
