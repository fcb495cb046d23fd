// DDP's gradient buckets seen at torch's dispatcher, in C++: the native form of
// dtprof/record/ddp_buckets.py (read that first; this file does the same with no Python on
// the bucket's path).
//
// While installed, a boxed kernel for c10d::allreduce_ under AutogradCPU and AutogradCUDA
// notes the time, passes the call below autograd unchanged, and, for calls on a watched
// process group that did not come through dtprof's wrapped Python API, keeps a record whose
// end a callback on the operation's future fills in (on the backend's thread, with no GIL to
// wait for). Python drains the records from dtprof's writer thread.
//
// Shared with Python through plain memory (ctypes), so that neither side calls the other on
// the hot path: the step in progress, one sequence counter per watched group (Python's
// wrapper numbers the same group's other collectives from the same counter), and, per thread,
// a flag that says the wrapped Python API is running on it.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <time.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr int64_t kSlots = 64;  // watched process groups at most
constexpr int64_t kFields = 11;  // a record's columns, in the order of Record

struct Shared {
  int64_t step;  // the step in progress (Python writes it)
  int64_t seq[kSlots];  // the next sequence number of each watched group (both sides)
};

struct Record {
  int64_t id, slot, seq, step, start_ns, end_ns, nbytes, dtype, floating, task, error;
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

int64_t now_ns() {
  // CLOCK_MONOTONIC: the clock of Python's time.perf_counter_ns() on Linux (checked on load)
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
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

void completed(int64_t id, bool error) {
  const int64_t end = now_ns();
  std::lock_guard<std::mutex> guard(mu);
  auto it = inflight.find(id);
  if (it == inflight.end()) {
    return;
  }
  Record rec = it->second;
  inflight.erase(it);
  rec.end_ns = end;
  rec.error = error ? 1 : 0;
  done.push_back(rec);
}

// c10d::allreduce_(Tensor[] tensors, ProcessGroup process_group, ReduceOp reduce_op,
//                  Tensor? sparse_indices, bool async_op, int timeout) -> (Tensor[], Work)
void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const int64_t start = now_ns();
  Record rec{};
  int64_t slot = -1;
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
          rec.task = torch::autograd::get_current_graph_task_id();
          rec.slot = slot;
          rec.step = shared.step;
          rec.seq = shared.seq[slot]++;
          rec.start_ns = start;
          rec.end_ns = -1;
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
    rec.end_ns = now_ns();
    rec.error = 1;
    std::lock_guard<std::mutex> guard(mu);
    rec.id = next_id++;
    done.push_back(rec);
    throw;
  }
  try {
    auto work = stack->back().toCustomClass<c10d::Work>();
    int64_t id = 0;
    {
      std::lock_guard<std::mutex> guard(mu);
      id = rec.id = next_id++;
      inflight.emplace(id, rec);
    }
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work->getFuture();
    } catch (const std::exception&) {  // a backend without futures: the end is unknown
      completed(id, false);
      return;
    }
    // may run at once, on this thread, where the operation is complete already
    future->addCallback([id](c10::ivalue::Future& f) { completed(id, f.hasError()); });
  } catch (const std::exception& e) {
    fail(std::string("following the operation: ") + e.what());
  }
}

at::Tensor as_tensor(const std::vector<Record>& records) {
  auto out = at::empty({static_cast<int64_t>(records.size()), kFields},
                       at::TensorOptions().dtype(at::kLong));
  static_assert(sizeof(Record) == kFields * sizeof(int64_t), "Record is kFields int64s");
  if (!records.empty()) {
    std::memcpy(out.data_ptr<int64_t>(), records.data(), records.size() * sizeof(Record));
  }
  return out;
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
  shared = Shared{};
  enabled.store(true);
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

at::Tensor drain() {
  std::vector<Record> out;
  {
    std::lock_guard<std::mutex> guard(mu);
    out.swap(done);
  }
  return as_tensor(out);
}

at::Tensor pending() {
  std::vector<Record> out;
  {
    std::lock_guard<std::mutex> guard(mu);
    out.reserve(inflight.size());
    for (const auto& kv : inflight) {
      out.push_back(kv.second);
    }
  }
  return as_tensor(out);
}

std::string failed() {
  std::lock_guard<std::mutex> guard(mu);
  return failure;
}

int64_t shared_address() { return reinterpret_cast<int64_t>(&shared); }
int64_t depth_address() { return reinterpret_cast<int64_t>(&api_depth); }
int64_t clock_now() { return now_ns(); }

at::Tensor dtype_probe(int64_t code) {
  return at::empty({0}, at::TensorOptions().dtype(static_cast<at::ScalarType>(code)));
}

}  // namespace

TORCH_LIBRARY(dtprof_native, m) {
  m.def("install() -> ()", &install);
  m.def("watch(__torch__.torch.classes.c10d.ProcessGroup group) -> int", &watch);
  m.def("uninstall() -> ()", &uninstall);
  m.def("drain() -> Tensor", &drain);
  m.def("pending() -> Tensor", &pending);
  m.def("failed() -> str", &failed);
  m.def("shared_address() -> int", &shared_address);
  m.def("depth_address() -> int", &depth_address);
  m.def("now() -> int", &clock_now);
  m.def("dtype_probe(int code) -> Tensor", &dtype_probe);
}
