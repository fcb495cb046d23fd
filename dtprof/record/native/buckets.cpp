// DDP's gradient buckets seen at torch's dispatcher, in C++: the native form of
// dtprof/record/ddp_buckets.py (read that first; this file does the same with no Python on
// the bucket's path).
//
// While installed, a boxed kernel for c10d::allreduce_ under AutogradCPU and AutogradCUDA
// notes the time, passes the call below autograd unchanged, and, for calls on a watched
// process group that did not come through dtprof's wrapped Python API, keeps a record whose
// end a callback on the operation's future fills in (on the backend's thread, with no GIL to
// wait for). Python takes the records on dtprof's writer thread, through a plain builtin
// (take_buckets, made by dtprof_bucket_taker()): a torch operator per tick, and a tensor of
// the rows converted to lists, cost several times more.
//
// Shared with Python through plain memory (ctypes), so that neither side calls the other on
// the hot path: the step in progress, one sequence counter per watched group (Python's
// wrapper numbers the same group's other collectives from the same counter), and, per thread,
// a flag that says the wrapped Python API is running on it.
//
// With GPU timing on (set_gpu_timing), a call on CUDA tensors also gets a CUDA event on the
// calling stream just after its launch: where the communication waits for the gradients, the
// bucket's arrival on the GPU. Its end comes from NCCL's own timing where the group's CUDA
// backend is NCCL (use_nccl_timing): NCCL records timing events around the operation on its
// own stream, and the record keeps the Work until it is complete, then takes its duration;
// the group's operations run one after another on that stream, so the operation started at
// its arrival or at the end of the group's previous one, whichever is later. Elsewhere, the
// end is an event recorded in the future's callback (run on a stream made to wait for the
// operation's end). An event there costs a GPU-bound step about 1% with DDP's buckets on NCCL
// (docs/gpu.md); NCCL's own events cost nothing measurable. Such a record stays in flight until
// take_buckets() finds that the GPU has passed its end; it then gets the GPU's times on the
// host's clock, through an anchor: an event recorded on an idle stream and waited for by
// anchor(), whose host time is known to within half that wait. These are c10::Events,
// device-generic: nothing here needs CUDA's headers, and a CPU build of torch never makes one.
// What dtprof/record/gpu_timing.py does in Python for the other intervals. A call launched into a
// CUDA graph's capture is recorded on the host alone (capturing()).

#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include "clock.h"

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using dtprof::now_ns;

constexpr int64_t kSlots = 64;  // watched process groups at most
constexpr int64_t kFields = 13;  // a record's columns, in the order of Record
constexpr size_t kMaxTimed = 20000;  // records waiting for the GPU at most (then: not timed)
constexpr size_t kKeepAnchors = 120;

struct Shared {
  int64_t step;  // the step in progress (Python writes it)
  int64_t seq[kSlots];  // the next sequence number of each watched group (both sides)
};

struct Record {
  int64_t id, slot, seq, step, start_ns, end_ns, nbytes, dtype, floating;
  int64_t bucket;  // its index within its backward pass; -1: DDP's map of used parameters
  int64_t error;
  int64_t gpu_start_ns, gpu_end_ns;  // -1: not timed on the GPU
};

struct Timed {  // the GPU's side of a record timed on the GPU
  std::optional<c10::Event> start, end;
  c10::intrusive_ptr<c10d::Work> work;  // where NCCL times it: its duration, once complete
};

struct Anchor {
  int64_t host_ns;
  c10::Event event;
};

Shared shared{};
thread_local int64_t api_depth = 0;  // > 0 while dtprof's wrapped Python API runs here

std::mutex mu;  // guards everything below
std::unique_ptr<torch::Library> lib;
std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> watched;  // index = slot
std::atomic<int64_t> n_watched{0};
std::atomic<bool> enabled{false};
std::map<int64_t, Record> inflight;  // by id: launch order
std::vector<Record> done;
int64_t next_id = 0;
std::string failure;
std::atomic<bool> gpu_timing{false};
std::map<int64_t, Timed> timed;  // by id: the records of `inflight` timed on the GPU
std::vector<c10::Event> spare;  // events read back, to be recorded again
std::vector<Anchor> anchors;  // by host time
int64_t gpu_dropped = 0;
std::array<std::atomic<bool>, kSlots> nccl_timed{};  // per slot: NCCL times its operations
std::array<int64_t, kSlots> nccl_last_end{};  // per slot: the GPU end of its last timed one
std::array<int64_t, kSlots> last_task{};  // per slot: the backward pass of its last bucket
std::array<int64_t, kSlots> next_bucket{};  // per slot: the index its next bucket gets

c10::Stream current_stream(c10::Device device) {
  c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getStream(device);
}

// an event recorded now on the device's current stream (takes mu)
c10::Event record_event(c10::Device device) {
  std::optional<c10::Event> event;
  {
    std::lock_guard<std::mutex> guard(mu);
    if (!spare.empty()) {
      event.emplace(std::move(spare.back()));
      spare.pop_back();
    }
  }
  if (!event || event->device_type() != device.type()) {
    event.emplace(device.type(), c10::EventFlag::BACKEND_DEFAULT);  // with timing
  }
  event->record(current_stream(device));
  return std::move(*event);
}

// Whether `stream`, a CUDA stream, is being captured into a CUDA graph, as the driver (loaded
// by the process that has CUDA tensors) says. A launch into a capture does not run: its future
// completes at once, and a callback on it would run on streams that join the capture and are
// never joined back, which invalidates the user's graph. Where the driver cannot be asked (no
// such library), false; where it does not answer, true: nothing is attached then.
bool capturing(const c10::Stream& stream) {
  using IsCapturing = int (*)(void*, int*);  // cuStreamIsCapturing(CUstream, status*)
  static const IsCapturing ask = [] {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    return driver ? reinterpret_cast<IsCapturing>(dlsym(driver, "cuStreamIsCapturing"))
                  : nullptr;
  }();
  if (ask == nullptr) {
    return false;
  }
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  return ask(stream.native_handle(), &status) != 0 || status != 0;
}

void fail(const std::string& what) {
  enabled.store(false);
  std::lock_guard<std::mutex> guard(mu);
  if (failure.empty()) {
    failure = what;
  }
}

int64_t slot_of(const c10::IValue& group) {
  const auto* pg = group.toCustomClass<c10d::ProcessGroup>().get();
  const int64_t n = n_watched.load();
  for (int64_t i = 0; i < n; ++i) {
    if (watched[i].get() == pg) {
      return i;
    }
  }
  return -1;
}

// the operation's future completed (on its callback's thread and streams)
void completed(int64_t id, bool error, std::optional<c10::Device> gpu) {
  const int64_t end = now_ns();
  std::optional<c10::Event> end_event;
  if (gpu && !error) {
    try {
      end_event.emplace(record_event(*gpu));
    } catch (const std::exception& e) {
      fail(std::string("timing on the GPU: ") + e.what());
    }
  }
  std::lock_guard<std::mutex> guard(mu);
  auto it = inflight.find(id);
  if (it == inflight.end()) {
    return;
  }
  it->second.end_ns = end;
  it->second.error = error ? 1 : 0;
  auto t = timed.find(id);
  if (t != timed.end()) {
    if (end_event) {  // in flight until the GPU has passed it: take_buckets() finishes it
      t->second.end.emplace(std::move(*end_event));
      return;
    }
    if (t->second.work && !error) {  // timed by NCCL: take_buckets() finishes it
      return;
    }
    if (t->second.start) {
      spare.push_back(std::move(*t->second.start));
    }
    timed.erase(t);
  }
  done.push_back(it->second);
  inflight.erase(it);
}

// A record's id and bucket index, in launch order (holding mu): DDP launches a backward
// pass's buckets (autograd graph task `task`) in index order, from 0; a call that is not
// floating-point is DDP's map of used parameters, no bucket.
void number(Record& rec, int64_t task) {
  rec.id = next_id++;
  rec.bucket = -1;
  if (rec.floating) {
    if (task != last_task[rec.slot]) {
      last_task[rec.slot] = task;
      next_bucket[rec.slot] = 0;
    }
    rec.bucket = next_bucket[rec.slot]++;
  }
}

// A record whose operation ends now, with no callback to wait for, into `done`.
void done_now(Record& rec, int64_t task) {
  rec.end_ns = now_ns();
  std::lock_guard<std::mutex> guard(mu);
  number(rec, task);
  done.push_back(rec);
}

// c10d::allreduce_(Tensor[] tensors, ProcessGroup process_group, ReduceOp reduce_op,
//                  Tensor? sparse_indices, bool async_op, int timeout) -> (Tensor[], Work)
void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const int64_t start = now_ns();
  Record rec{};
  int64_t task = -1;  // the autograd graph task (backward pass) launching it
  int64_t slot = -1;
  std::optional<c10::Device> gpu;  // the device of a call timed on the GPU
  std::optional<c10::Device> cuda;  // the device of a call on CUDA tensors
  if (enabled.load(std::memory_order_relaxed) && api_depth == 0 && stack->size() >= 6) {
    try {
      const auto base = stack->size() - 6;
      slot = slot_of((*stack)[base + 1]);
      if (slot >= 0) {
        const auto tensors = (*stack)[base].toTensorList();
        int64_t nbytes = 0;
        for (const at::Tensor t : tensors) {
          nbytes += static_cast<int64_t>(t.nbytes());
        }
        if (tensors.empty()) {
          slot = -1;
        } else {
          const at::Tensor first = tensors.get(0);
          rec.nbytes = nbytes;
          rec.dtype = static_cast<int64_t>(first.scalar_type());
          rec.floating = (first.is_floating_point() || first.is_complex()) ? 1 : 0;
          task = torch::autograd::get_current_graph_task_id();
          rec.slot = slot;
          rec.step = shared.step;
          rec.seq = shared.seq[slot]++;
          rec.start_ns = start;
          rec.end_ns = -1;
          rec.gpu_start_ns = rec.gpu_end_ns = -1;
          if (first.is_cuda()) {
            cuda = first.device();
            if (gpu_timing.load(std::memory_order_relaxed)) {
              gpu = cuda;
            }
          }
        }
      }
    } catch (const std::exception& e) {
      fail(std::string("reading the call: ") + e.what());
      slot = -1;
    }
  }
  if (slot < 0) {
    op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
    return;
  }
  try {
    op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
  } catch (...) {  // the operation's own error: recorded as one, then passed on
    rec.error = 1;
    done_now(rec, task);
    throw;
  }
  try {
    auto work = stack->back().toCustomClass<c10d::Work>();
    if (cuda && capturing(current_stream(*cuda))) {  // captured, not run: no event, no callback
      done_now(rec, task);
      return;
    }
    std::optional<c10::Event> start_event;
    const bool by_nccl = gpu && nccl_timed[slot].load(std::memory_order_relaxed);
    if (gpu) {  // the current stream, just after the launch made the communication wait for it
      try {
        start_event.emplace(record_event(*gpu));
      } catch (const std::exception& e) {
        fail(std::string("timing on the GPU: ") + e.what());
        gpu.reset();
      }
    }
    int64_t id = 0;
    {
      std::lock_guard<std::mutex> guard(mu);
      number(rec, task);
      id = rec.id;
      inflight.emplace(id, rec);
      if (start_event) {
        if (timed.size() < kMaxTimed) {
          Timed& t = timed[id];
          t.start.emplace(std::move(*start_event));
          if (by_nccl) {
            t.work = work;
          }
        } else {
          ++gpu_dropped;
          spare.push_back(std::move(*start_event));
          gpu.reset();
        }
      }
    }
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work->getFuture();
    } catch (const std::exception&) {  // a backend without futures: the end is unknown
      completed(id, false, std::nullopt);
      return;
    }
    // may run at once, on this thread, where the operation is complete already (on NCCL, at
    // launch); an end event only where NCCL does not time the operation
    const std::optional<c10::Device> end_on = by_nccl ? std::nullopt : gpu;
    future->addCallback(
        [id, end_on](c10::ivalue::Future& f) { completed(id, f.hasError(), end_on); });
  } catch (const std::exception& e) {
    fail(std::string("following the operation: ") + e.what());
  }
}

void install() {
  std::lock_guard<std::mutex> guard(mu);
  if (lib) {
    return;
  }
  auto fresh = std::make_unique<torch::Library>(
      torch::Library::IMPL, "c10d", std::nullopt, __FILE__, __LINE__);
  for (auto key : {c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutogradCUDA}) {
    fresh->impl("allreduce_",
                torch::dispatch(key, torch::CppFunction::makeFromBoxedFunction<&kernel>()));
  }
  lib = std::move(fresh);
  watched.clear();
  watched.reserve(kSlots);  // never reallocated while the kernel reads it
  n_watched.store(0);
  inflight.clear();
  done.clear();
  failure.clear();
  timed.clear();
  anchors.clear();
  gpu_dropped = 0;
  for (auto& on : nccl_timed) {
    on.store(false);
  }
  nccl_last_end.fill(0);
  shared = Shared{};
  enabled.store(true);
}

void set_gpu_timing(bool on) { gpu_timing.store(on); }

// NCCL's own timing for the calls on CUDA tensors of watched group `slot`, where its CUDA
// backend is NCCL: turned on for the group (for good: torch has no way to turn it off; it
// costs nothing measurable) and used from the next call. Whether it is used.
bool use_nccl_timing(int64_t slot) {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  {
    std::lock_guard<std::mutex> guard(mu);
    TORCH_CHECK(slot >= 0 && slot < n_watched.load(), "dtprof_native: no watched group ", slot);
    group = watched[slot];
  }
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = group->getBackend(c10::DeviceType::CUDA);
  } catch (const std::exception&) {  // no backend for CUDA tensors
    return false;
  }
  if (!backend || backend->getBackendName() != "nccl") {
    return false;
  }
  backend->enableCollectivesTiming();
  nccl_timed[slot].store(true);
  return true;
}

// A new anchor on `device`: returns the bound on its host time's error, in ns.
int64_t anchor(int64_t device_index) {
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_index));
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream idle = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
  c10::Event event(device.type(), c10::EventFlag::BACKEND_DEFAULT);
  const int64_t before = now_ns();
  event.record(idle);
  event.synchronize();
  const int64_t after = now_ns();
  std::lock_guard<std::mutex> guard(mu);
  anchors.push_back(Anchor{before + (after - before) / 2, std::move(event)});
  if (anchors.size() > kKeepAnchors) {
    anchors.erase(anchors.begin());
  }
  return (after - before + 1) / 2;
}

// The CUDA events let go of (after uninstall, once the GPU times have been drained): records
// still waiting for the GPU are done without its times. None is left for the static
// destructors at exit, which may run after CUDA has gone.
void release_gpu() {
  std::lock_guard<std::mutex> guard(mu);
  for (auto& kv : timed) {
    auto it = inflight.find(kv.first);
    if (it != inflight.end() && it->second.end_ns >= 0) {
      done.push_back(it->second);
      inflight.erase(it);
    }
  }
  timed.clear();
  spare.clear();
  anchors.clear();
}

int64_t dropped() {
  std::lock_guard<std::mutex> guard(mu);
  return gpu_dropped;
}

// The last anchor before a call at host time `start_ns` (the first one where there is none).
const Anchor& anchor_for(int64_t start_ns) {
  auto at = anchors.begin();
  for (auto a = anchors.begin(); a != anchors.end() && a->host_ns <= start_ns; ++a) {
    at = a;
  }
  return *at;
}

// The host time, in ns, of `event`: a completed event recorded after `at`'s.
int64_t host_time(const Anchor& at, const c10::Event& event) {
  return at.host_ns + std::llround(at.event.elapsedTime(event) * 1e6);
}

// Whether NCCL is done with a record's operation (where it cannot say: done, and not timed).
bool nccl_done(const Timed& events) {
  try {
    return events.work->isCompleted();
  } catch (const std::exception&) {
    return true;
  }
}

// Under mu: the GPU's start and end of `rec`, timed by NCCL, into the record; false where
// NCCL's timing cannot say (the operation failed). The group's last end moves on.
bool nccl_times(Record& rec, const Anchor& at, Timed& events) {
  float duration_ms = 0;
  try {
    duration_ms = events.work->getDuration();
  } catch (const std::exception&) {
    return false;
  }
  rec.gpu_start_ns = host_time(at, *events.start);
  const int64_t began = std::max(rec.gpu_start_ns, nccl_last_end[rec.slot]);
  rec.gpu_end_ns = began + std::llround(static_cast<double>(duration_ms) * 1e6);
  nccl_last_end[rec.slot] = rec.gpu_end_ns;
  return true;
}

// Under mu: the records the GPU has passed, with its times, into `done`. Those timed by NCCL
// in launch order within their group (each starts after the one before it ends).
void finish_timed() {
  std::array<bool, kSlots> waiting{};  // a group whose earlier NCCL-timed record is not done
  for (auto t = timed.begin(); t != timed.end();) {
    Timed& events = t->second;
    auto it = inflight.find(t->first);
    if (events.work && it != inflight.end()) {
      Record& rec = it->second;
      const bool ready =
          !waiting[rec.slot] && rec.end_ns >= 0 && nccl_done(events) && events.start->query();
      if (!ready) {
        waiting[rec.slot] = true;
        ++t;
        continue;
      }
      if (anchors.empty() || !nccl_times(rec, anchor_for(rec.start_ns), events)) {
        rec.gpu_start_ns = rec.gpu_end_ns = -1;  // done, not timed
      }
      done.push_back(rec);
      inflight.erase(it);
      spare.push_back(std::move(*events.start));
      t = timed.erase(t);
      continue;
    }
    if (!events.work && (!events.start || !events.end || !events.end->query() ||
                         !events.start->query())) {
      ++t;
      continue;
    }
    if (it != inflight.end() && !anchors.empty()) {
      Record& rec = it->second;
      const Anchor& at = anchor_for(rec.start_ns);
      rec.gpu_start_ns = host_time(at, *events.start);
      rec.gpu_end_ns = host_time(at, *events.end);
      rec.gpu_end_ns = std::max(rec.gpu_end_ns, rec.gpu_start_ns);
      done.push_back(rec);
      inflight.erase(it);
    } else if (it != inflight.end()) {  // no anchor: done, not timed
      done.push_back(it->second);
      inflight.erase(it);
    }
    if (events.start) {
      spare.push_back(std::move(*events.start));
    }
    if (events.end) {
      spare.push_back(std::move(*events.end));
    }
    t = timed.erase(t);
  }
}

int64_t watch(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  std::lock_guard<std::mutex> guard(mu);
  TORCH_CHECK(lib, "dtprof_native: watch() before install()");
  const int64_t n = n_watched.load();
  for (int64_t i = 0; i < n; ++i) {
    if (watched[i].get() == group.get()) {
      return i;
    }
  }
  TORCH_CHECK(n < kSlots, "dtprof_native: more than ", kSlots, " process groups watched");
  watched.push_back(group);
  last_task[n] = -2;  // no backward pass's: the first bucket is 0
  next_bucket[n] = 0;
  n_watched.store(n + 1);
  return n;
}

void uninstall() {
  enabled.store(false);
  std::unique_ptr<torch::Library> old;
  {
    std::lock_guard<std::mutex> guard(mu);
    old = std::move(lib);
  }
  old.reset();  // the kernel is deregistered: calls go straight to the backend again
  std::lock_guard<std::mutex> guard(mu);
  n_watched.store(0);
  watched.clear();  // the groups' references
}

static_assert(sizeof(Record) == kFields * sizeof(int64_t), "Record is kFields int64s");

// the records' fields as bytes, kFields int64s a record (a new reference)
PyObject* as_bytes(const std::vector<Record>& records) {
  const auto size = static_cast<Py_ssize_t>(records.size() * sizeof(Record));
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(records.data()), size);
}

// a list of tuples, one per record (a new reference; nullptr with a Python error set)
PyObject* as_rows(const std::vector<Record>& records) {
  PyObject* rows = PyList_New(static_cast<Py_ssize_t>(records.size()));
  for (size_t i = 0; rows != nullptr && i < records.size(); ++i) {
    const auto* field = reinterpret_cast<const int64_t*>(&records[i]);
    PyObject* row = PyTuple_New(kFields);
    for (int64_t j = 0; row != nullptr && j < kFields; ++j) {
      PyObject* value = PyLong_FromLongLong(field[j]);
      if (value == nullptr) {
        Py_CLEAR(row);
        break;
      }
      PyTuple_SET_ITEM(row, j, value);
    }
    if (row == nullptr) {
      Py_CLEAR(rows);
      break;
    }
    PyList_SET_ITEM(rows, static_cast<Py_ssize_t>(i), row);
  }
  return rows;
}

// take_buckets() -> (failure, done, in_flight): the library's failure ("" if none), the
// records completed since the last take (bytes: kFields native int64s a record, in Record's
// order, for numpy) and those still in flight (tuples of the Record's fields, in its order). A record timed on the GPU is complete once the GPU has passed it.
// Holds mu while it copies, never while it makes Python objects; nothing that holds mu waits
// for the GIL.
PyObject* take_buckets(PyObject* /*self*/, PyObject* /*unused*/) {
  std::vector<Record> taken, in_flight;
  std::string why;
  {
    std::lock_guard<std::mutex> guard(mu);
    if (!timed.empty()) {
      try {
        finish_timed();
      } catch (const std::exception& e) {
        failure = std::string("reading the GPU's times: ") + e.what();
        enabled.store(false);
      }
    }
    taken.swap(done);
    in_flight.reserve(inflight.size());
    for (const auto& kv : inflight) {
      in_flight.push_back(kv.second);
    }
    why = failure;
  }
  const auto length = static_cast<Py_ssize_t>(why.size());
  PyObject* text = PyUnicode_DecodeUTF8(why.data(), length, "replace");
  PyObject* done_rows = text != nullptr ? as_bytes(taken) : nullptr;
  PyObject* flight_rows = done_rows != nullptr ? as_rows(in_flight) : nullptr;
  if (flight_rows == nullptr) {
    Py_XDECREF(text);
    Py_XDECREF(done_rows);
    return nullptr;
  }
  return Py_BuildValue("(NNN)", text, done_rows, flight_rows);
}

PyMethodDef take_def = {
    "take_buckets",
    take_buckets,
    METH_NOARGS,
    "(failure, completed records, records in flight), taken from the native kernel."};

int64_t shared_address() { return reinterpret_cast<int64_t>(&shared); }
int64_t depth_address() { return reinterpret_cast<int64_t>(&api_depth); }
int64_t clock_now() { return now_ns(); }

at::Tensor dtype_probe(int64_t code) {
  return at::empty({0}, at::TensorOptions().dtype(static_cast<at::ScalarType>(code)));
}

}  // namespace

TORCH_LIBRARY(dtprof_native, m) {
  m.def("install() -> ()", &install);
  m.def("set_gpu_timing(bool on) -> ()", &set_gpu_timing);
  m.def("use_nccl_timing(int slot) -> bool", &use_nccl_timing);
  m.def("anchor(int device_index) -> int", &anchor);
  m.def("gpu_dropped() -> int", &dropped);
  m.def("release_gpu() -> ()", &release_gpu);
  m.def("watch(__torch__.torch.classes.c10d.ProcessGroup group) -> int", &watch);
  m.def("uninstall() -> ()", &uninstall);
  m.def("shared_address() -> int", &shared_address);
  m.def("depth_address() -> int", &depth_address);
  m.def("now() -> int", &clock_now);
  m.def("dtype_probe(int code) -> Tensor", &dtype_probe);
}

extern "C" {

// the builtin take_buckets, for Python (a new reference)
PyObject* dtprof_bucket_taker() { return PyCFunction_New(&take_def, nullptr); }

// the step in progress, which records are stamped with: phases.cpp's profiler_step writes it
// here as Python's Profiler.step writes it through shared_address()
void dtprof_buckets_step_is(int64_t step) { shared.step = step; }

}  // extern "C"
