// The phases timed in C++: the native form of dtprof/record/phases.py's PhaseHooks and
// TimedForward (read those first; this file does the same for the common case, with no Python
// on the training step's path, and hands the rest to them).
//
// Why: natively dtprof's per-step code runs cold, between long stretches of torch's kernels,
// where a few lines of Python cost microseconds (a tensor's .shape alone about 2.5 µs). The
// phase hooks were most of recording's fixed cost per step.
//
// - ForwardTimer, the model's forward timed: the type of the object set as the model's own
//   ``forward`` (as TimedForward is in Python). It closes the data phase, counts the pass's
//   samples and tokens where its input is a plain tensor (batch_counts' common cases; any other
//   input, and every pass while FLOPs are being counted, goes to StepWork.forward_begins),
//   times the forward, and watches the output's autograd node for the backward (a plain
//   tensor output; any other goes to PhaseHooks.watch_output).
// - The backward: watch() adds a pre-hook to the node that made an output. When the gradient
//   reaches that node (the first of the pass, if several outputs are watched), the hook notes
//   the time and queues a callback on the autograd engine for the end of the pass. A pass
//   whose backward raised never reaches its end: the next forward pass outside a backward
//   forgets it, so that the passes after it are timed. Under compiled autograd the hook is
//   skipped (it tells the compiler nothing), so the pass has no span there; it never makes
//   the user's backward fail.
// - The optimizer's step pre- and post-hook, plain builtins that torch calls; a step given
//   arguments (a closure) goes to PhaseHooks.closure_given.
//
// - step_ends(step, data_from), which Python's Profiler.step calls at each step's end: the
//   step's samples and tokens (counted here or by StepWork, which adds to the same numbers) into
//   their ring, the next step's number and its data phase's start.
// - profiler_step(), Profiler.step's native form, which the profiler sets as its own ``step``
//   while the phases are timed here: the step's row into a third ring, the RSS read into a
//   fourth when due (on a job without CUDA; otherwise, and for fingerprints, the profiler's
//   extras are called), then step_ends' work. It reads and writes the profiler's attributes in
//   its __dict__ (``active``, ``step_index``, ``step_start_ns``), so that Python reads them as
//   ever.
//
// Every span is written into one ring (step, phase, start, end), and each step's counts into
// another (step, samples, tokens), that Python reads through plain memory, on dtprof's writer
// thread at each tick and at the profile's end, after dtprof_phases_written() or
// dtprof_counts_written(), whose acquire load makes every row below the count it returns
// complete. The step in progress, the data phase's start and the step's counts so far are a few
// numbers Python shares the same way (dtprof_phases_state()). Both sides touch them holding the
// GIL. One profile records at a time in a process, so all this is global.

#include <Python.h>
#include <c10/core/GradMode.h>
#include <c10/core/TensorImpl.h>
#include <structmember.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>

#include "attrs.h"
#include "clock.h"
#include "failure.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>

extern "C" void dtprof_buckets_step_is(int64_t step);  // buckets.cpp

namespace {

using dtprof::now_ns;
using dtprof::said_to;
using dtprof::store;

constexpr int64_t kRing = 16384;  // spans Python may fall behind by before losing some

// a span's phase: PHASES in dtprof/record/phases.py names them
enum Phase : int64_t { kData = 0, kForward = 1, kBackward = 2, kOptimizer = 3 };

struct Ring {
  std::atomic<int64_t> written;  // spans written so far; span i is at rows[i % kRing]
  int64_t rows[kRing][4];  // step, phase, start_ns, end_ns
};

Ring ring{};
std::mutex ring_mu;  // one writer at a time: the training thread, or the engine's at a pass's end

void write_span(int64_t step, Phase phase, int64_t start, int64_t end) {
  std::lock_guard<std::mutex> guard(ring_mu);
  const int64_t i = ring.written.load(std::memory_order_relaxed);
  int64_t* row = ring.rows[i % kRing];
  row[0] = step;
  row[1] = phase;
  row[2] = start;
  row[3] = end;
  ring.written.store(i + 1, std::memory_order_release);
}

// the numbers Python shares (STATE in dtprof/record/phases.py names them)
enum Field {
  kStep,  // the step in progress
  kDataFrom,  // where the data phase began; -1: none open
  kOptimizerFrom,  // where the optimizer's phase began
  kSamples,  // this step's samples and tokens counted here (Python's count is apart)
  kTokens,
  kSeen,  // 1: a training pass was counted here this step
  kWorkInPython,  // 1: every pass's work is StepWork's to count (FLOPs are being counted)
  kExtrasDue,  // profiler_step calls the profiler's extras at a step ending from then on
  kRssDue,  // profiler_step reads the RSS itself at a step ending from then on
  kRssEvery,  // and then again this many ns later (memory.EVERY_NS)
  kFields
};
int64_t state[kFields] = {0, -1, 0, 0, 0, 0, 1, 0, 0, 0};

struct CountRing {
  std::atomic<int64_t> written;  // steps written so far; step i is at rows[i % kRing]
  int64_t rows[kRing][3];  // step, samples, tokens
};

CountRing counts{};  // written by the training thread alone, holding the GIL
CountRing steps{};  // (step, start_ns, end_ns), by profiler_step: the same shape
CountRing rss{};  // (step, ts_ns, resident bytes), by profiler_step: the same shape

// ------------------------------------------------------------------ backward

struct Pass {
  int64_t step, start_ns;
};

std::mutex pass_mu;  // guards `open`
std::optional<Pass> open;  // the pass in progress: its hook fired, its end has not come

// the engine's final callback: the end of the pass
void pass_ends() {
  const int64_t end = now_ns();
  std::optional<Pass> pass;
  {
    std::lock_guard<std::mutex> guard(pass_mu);
    pass.swap(open);
  }
  if (pass) {
    write_span(pass->step, kBackward, pass->start_ns, end);
  }
}

struct PassBegins final : torch::autograd::FunctionPreHook {
  explicit PassBegins(int64_t step) : step(step) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& grads) override {
    try {
      bool first = false;
      {
        std::lock_guard<std::mutex> guard(pass_mu);
        if (!open) {
          open = Pass{step, now_ns()};
          first = true;
        }
      }
      if (first) {
        torch::autograd::Engine::get_default_engine().queue_callback(pass_ends);
      }
    } catch (...) {  // no span for this pass, never a failed backward
      std::lock_guard<std::mutex> guard(pass_mu);
      open.reset();
    }
    return grads;
  }

  // compiled autograd asks each hook to describe itself: this one adds nothing, so it is
  // left out (torch's default raises). One of the two is the virtual of the torch in use.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const {}
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) {}

  int64_t step;
};

// 1: the pass that reaches the tensor's node will be timed; 0: the tensor has no node (a
// leaf); -1: the hook could not be added
int watch(const at::Tensor& tensor, int64_t step) {
  try {
    if (torch::autograd::get_current_graph_task_id() == -1) {
      // a forward pass outside any backward: a pass still open is one that raised (its end
      // never came), and would keep every later pass from being timed
      std::lock_guard<std::mutex> guard(pass_mu);
      open.reset();
    }
    const auto& node = tensor.grad_fn();
    if (!node) {
      return 0;
    }
    node->add_pre_hook(std::make_unique<PassBegins>(step));
    return 1;
  } catch (...) {
    return -1;
  }
}

// watch_backward(tensor_impl: int, step: int) -> bool: whether the pass will be timed
PyObject* watch_backward(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "watch_backward(tensor_impl, step)");
    return nullptr;
  }
  const int64_t address = PyLong_AsLongLong(args[0]);
  const int64_t step = PyLong_AsLongLong(args[1]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  if (address == 0) {
    Py_RETURN_FALSE;
  }
  auto* impl = reinterpret_cast<c10::TensorImpl*>(address);
  const at::Tensor tensor(
      c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl));
  return PyBool_FromLong(watch(tensor, step) == 1);
}

PyMethodDef watch_def = {
    "watch_backward",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(watch_backward)),
    METH_FASTCALL,
    "Time the backward pass that reaches this tensor's autograd node, as this step's."};

// ------------------------------------------------------------------ forward

// the tensor a forward pass's samples are counted from, where counting it here gives what
// dtprof.record.throughput.batch_counts gives: a plain tensor, first among the arguments,
// with no input_ids or inputs_embeds among the keywords; else null (Python counts)
const at::Tensor* plain_input(PyObject* args, PyObject* kwargs) {
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    return nullptr;
  }
  if (PyTuple_GET_SIZE(args) == 0) {
    return nullptr;
  }
  PyObject* first = PyTuple_GET_ITEM(args, 0);
  if (!THPVariable_CheckExact(first)) {
    return nullptr;
  }
  const at::Tensor& tensor = THPVariable_Unpack(first);
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (impl->is_python_dispatch() || impl->has_symbolic_sizes_strides()) {
    return nullptr;
  }
  return &tensor;
}

bool token_ids(c10::ScalarType dtype) {  // TOKEN_IDS in dtprof/record/throughput.py
  switch (dtype) {
    case c10::ScalarType::Long:
    case c10::ScalarType::Int:
    case c10::ScalarType::Short:
    case c10::ScalarType::Char:
    case c10::ScalarType::Byte:
      return true;
    default:
      return false;
  }
}

// batch_counts for a plain tensor: a 0-d one counts nothing
void count(const at::Tensor& tensor) {
  const auto sizes = tensor.sizes();
  if (sizes.empty()) {
    return;
  }
  state[kSeen] = 1;
  state[kSamples] += sizes[0];
  if (sizes.size() == 2 && token_ids(tensor.scalar_type())) {
    state[kTokens] += sizes[0] * sizes[1];
  }
}

struct ForwardTimer {
  PyObject_HEAD
  PyObject* wrapped;  // __wrapped__: the forward it times
  PyObject* module;
  PyObject* hooks;  // the PhaseHooks; None once released
  PyObject* had_own;  // whether the forward was the instance's own (set and read by Python)
  // the PhaseHooks' and StepWork's methods it hands what it does not do itself
  PyObject* work_begins;  // StepWork.forward_begins(module, args, kwargs)
  PyObject* work_ends;  // StepWork.forward_ends()
  PyObject* watch_output;  // PhaseHooks.watch_output(output, step)
  PyObject* failed;  // PhaseHooks.native_failed(exc)
};

// a failure in recording: said to Python, which switches the phases off; the call goes on
void recording_failed(ForwardTimer* self) { said_to(self->failed); }

// the beginning: data phase closed, work counted; returns whether StepWork counted it
// (nullopt: failed, the Python error set)
std::optional<bool> forward_begins(ForwardTimer* self, int64_t t, PyObject* args,
                                   PyObject* kwargs) {
  if (state[kDataFrom] != -1) {
    write_span(state[kStep], kData, state[kDataFrom], t);
    state[kDataFrom] = -1;
  }
  if (!c10::GradMode::is_enabled()) {
    return false;
  }
  if (state[kWorkInPython] == 0) {
    const at::Tensor* input = plain_input(args, kwargs);
    if (input != nullptr) {
      count(*input);
      return false;
    }
  }
  PyObject* kw = kwargs != nullptr ? kwargs : Py_None;
  PyObject* done = PyObject_CallFunctionObjArgs(self->work_begins, self->module, args, kw, nullptr);
  if (done == nullptr) {
    return std::nullopt;
  }
  Py_DECREF(done);
  return true;
}

// the end: the forward's span, the output watched for the backward; false: failed
bool forward_ends(ForwardTimer* self, int64_t start, int64_t end, bool work_in_python,
                  PyObject* output) {
  const int64_t step = state[kStep];
  if (work_in_python) {
    PyObject* done = PyObject_CallNoArgs(self->work_ends);
    if (done == nullptr) {
      return false;
    }
    Py_DECREF(done);
  }
  write_span(step, kForward, start, end);
  if (!c10::GradMode::is_enabled()) {
    return true;
  }
  if (THPVariable_Check(output)) {
    const at::Tensor& tensor = THPVariable_Unpack(output);
    if (!tensor.requires_grad() || watch(tensor, step) == 1) {
      return true;
    }
  }
  PyObject* step_object = PyLong_FromLongLong(step);
  if (step_object == nullptr) {
    return false;
  }
  PyObject* done = PyObject_CallFunctionObjArgs(self->watch_output, output, step_object, nullptr);
  Py_DECREF(step_object);
  if (done == nullptr) {
    return false;
  }
  Py_DECREF(done);
  return true;
}

PyObject* forward_call(PyObject* object, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<ForwardTimer*>(object);
  if (self->hooks == Py_None) {  // released, but something wrapped it since and still calls it
    return PyObject_Call(self->wrapped, args, kwargs);
  }
  const int64_t start = now_ns();
  std::optional<bool> work_in_python;
  try {
    work_in_python = forward_begins(self, start, args, kwargs);
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
  }
  if (!work_in_python) {
    recording_failed(self);
  }
  // the model's own forward, and its exception where it raises
  PyObject* output = PyObject_Call(self->wrapped, args, kwargs);
  if (output == nullptr || self->hooks == Py_None) {  // switched off by a failure above
    return output;
  }
  const int64_t end = now_ns();
  bool ok = false;
  try {
    ok = forward_ends(self, start, end, work_in_python.value_or(false), output);
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
  }
  if (!ok) {
    recording_failed(self);
  }
  return output;
}

// ForwardTimer(hooks, module, wrapped)
PyObject* forward_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *hooks = nullptr, *module = nullptr, *wrapped = nullptr;
  static const char* names[] = {"hooks", "module", "wrapped", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO", const_cast<char**>(names), &hooks,
                                   &module, &wrapped)) {
    return nullptr;
  }
  PyObject* work = PyObject_GetAttrString(hooks, "work");
  if (work == nullptr) {
    return nullptr;
  }
  PyObject* work_begins = PyObject_GetAttrString(work, "forward_begins");
  PyObject* work_ends = PyObject_GetAttrString(work, "forward_ends");
  Py_DECREF(work);
  PyObject* watch_output = PyObject_GetAttrString(hooks, "watch_output");
  PyObject* failed = PyObject_GetAttrString(hooks, "native_failed");
  auto* self = reinterpret_cast<ForwardTimer*>(type->tp_alloc(type, 0));
  if (self == nullptr || work_begins == nullptr || work_ends == nullptr ||
      watch_output == nullptr || failed == nullptr) {
    Py_XDECREF(work_begins);
    Py_XDECREF(work_ends);
    Py_XDECREF(watch_output);
    Py_XDECREF(failed);
    Py_XDECREF(self);
    return nullptr;
  }
  Py_INCREF(wrapped);
  Py_INCREF(module);
  Py_INCREF(hooks);
  Py_INCREF(Py_False);
  self->wrapped = wrapped;
  self->module = module;
  self->hooks = hooks;
  self->had_own = Py_False;
  self->work_begins = work_begins;
  self->work_ends = work_ends;
  self->watch_output = watch_output;
  self->failed = failed;
  return reinterpret_cast<PyObject*>(self);
}

int forward_traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<ForwardTimer*>(object);
  Py_VISIT(self->wrapped);
  Py_VISIT(self->module);
  Py_VISIT(self->hooks);
  Py_VISIT(self->had_own);
  Py_VISIT(self->work_begins);
  Py_VISIT(self->work_ends);
  Py_VISIT(self->watch_output);
  Py_VISIT(self->failed);
  Py_VISIT(Py_TYPE(object));  // a heap type
  return 0;
}

int forward_clear(PyObject* object) {
  auto* self = reinterpret_cast<ForwardTimer*>(object);
  Py_CLEAR(self->wrapped);
  Py_CLEAR(self->module);
  Py_CLEAR(self->hooks);
  Py_CLEAR(self->had_own);
  Py_CLEAR(self->work_begins);
  Py_CLEAR(self->work_ends);
  Py_CLEAR(self->watch_output);
  Py_CLEAR(self->failed);
  return 0;
}

void forward_dealloc(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  PyObject_GC_UnTrack(object);
  forward_clear(object);
  type->tp_free(object);
  Py_DECREF(type);
}

// copy.copy of the wrapped forward, as TimedForward.__reduce__ (see there)
PyObject* forward_reduce(PyObject* object, PyObject* /*unused*/) {
  auto* self = reinterpret_cast<ForwardTimer*>(object);
  PyObject* copy_module = PyImport_ImportModule("copy");
  if (copy_module == nullptr) {
    return nullptr;
  }
  PyObject* copy = PyObject_GetAttrString(copy_module, "copy");
  Py_DECREF(copy_module);
  if (copy == nullptr) {
    return nullptr;
  }
  PyObject* reduced = Py_BuildValue("(N(O))", copy, self->wrapped);
  return reduced;
}

PyMethodDef forward_methods[] = {
    {"__reduce__", forward_reduce, METH_NOARGS, "A copy or a pickle gets the forward it wraps."},
    {nullptr, nullptr, 0, nullptr}};

PyMemberDef forward_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(ForwardTimer, wrapped), READONLY, "the forward it times"},
    {"module", T_OBJECT, offsetof(ForwardTimer, module), READONLY, "the module it times"},
    {"hooks", T_OBJECT, offsetof(ForwardTimer, hooks), 0, "the PhaseHooks; None: released"},
    {"had_own", T_OBJECT, offsetof(ForwardTimer, had_own), 0, "the instance had a forward"},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot forward_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(forward_new)},
    {Py_tp_call, reinterpret_cast<void*>(forward_call)},
    {Py_tp_traverse, reinterpret_cast<void*>(forward_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(forward_clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(forward_dealloc)},
    {Py_tp_methods, forward_methods},
    {Py_tp_members, forward_members},
    {Py_tp_doc,
     const_cast<char*>("The model's forward, timed in C++: dtprof.record.phases.TimedForward's "
                       "native form.")},
    {0, nullptr}};

PyType_Spec forward_spec = {"dtprof_native.ForwardTimer", sizeof(ForwardTimer), 0,
                            Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, forward_slots};

// ------------------------------------------------------------------ optimizer

// optimizer_pre(optimizer, args, kwargs), a step pre-hook (torch hands it the step's
// arguments, the optimizer first); its self: PhaseHooks.closure_given, for a step given more
PyObject* optimizer_pre(PyObject* closure_given, PyObject* const* args, Py_ssize_t nargs) {
  state[kOptimizerFrom] = now_ns();
  if (nargs == 3 && PyTuple_Check(args[1]) && PyDict_Check(args[2]) &&
      (PyTuple_GET_SIZE(args[1]) > 1 || PyDict_GET_SIZE(args[2]) != 0)) {
    return PyObject_CallFunctionObjArgs(closure_given, args[1], args[2], nullptr);
  }
  Py_RETURN_NONE;
}

// optimizer_post(optimizer, args, kwargs), a step post-hook
PyObject* optimizer_post(PyObject* /*self*/, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  write_span(state[kStep], kOptimizer, state[kOptimizerFrom], now_ns());
  Py_RETURN_NONE;
}

void write_row(CountRing& ring, int64_t a, int64_t b, int64_t c) {
  const int64_t i = ring.written.load(std::memory_order_relaxed);
  int64_t* row = ring.rows[i % kRing];
  row[0] = a;
  row[1] = b;
  row[2] = c;
  ring.written.store(i + 1, std::memory_order_release);
}

// the step's counts into their ring (where a pass was counted), the next step's number and its
// data phase's start (-1: none) into the shared numbers
void counts_move_on(int64_t step, int64_t data_from) {
  if (state[kSeen] != 0) {
    write_row(counts, step, state[kSamples], state[kTokens]);
    state[kSamples] = state[kTokens] = state[kSeen] = 0;
  }
  state[kStep] = step + 1;
  state[kDataFrom] = data_from;
}

// step_ends(step, data_from): counts_move_on, for Python's Profiler.step
PyObject* step_ends(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "step_ends(step, data_from)");
    return nullptr;
  }
  const int64_t step = PyLong_AsLongLong(args[0]);
  const int64_t data_from = PyLong_AsLongLong(args[1]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  counts_move_on(step, data_from);
  Py_RETURN_NONE;
}

// ------------------------------------------------------------------ the profiler's step

// the profiler's attributes profiler_step reads and writes, as keys of its __dict__
struct Keys {
  PyObject *active, *step_index, *step_start_ns;
};

const Keys& keys() {
  static const Keys k{PyUnicode_InternFromString("active"),
                      PyUnicode_InternFromString("step_index"),
                      PyUnicode_InternFromString("step_start_ns")};
  return k;
}

// /proc/self/statm, kept open as dtprof.record.memory keeps it: one pread a reading
int statm_fd = -1;
bool statm_unreadable = false;  // no such file here: the profiler's Python reads memory

void statm_forgotten() {  // in a forked child, whose /proc/self is another file
  if (statm_fd >= 0) {
    close(statm_fd);
  }
  statm_fd = -1;
}

// the resident set size in bytes; -1 where it cannot be read here
int64_t resident_bytes() {
  if (statm_fd < 0 && !statm_unreadable) {
    static const bool forked_forgets = pthread_atfork(nullptr, nullptr, statm_forgotten) == 0;
    statm_fd = forked_forgets ? ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC) : -1;
    statm_unreadable = statm_fd < 0;
  }
  if (statm_fd < 0) {
    return -1;
  }
  char text[128];
  const ssize_t n = pread(statm_fd, text, sizeof(text) - 1, 0);
  if (n <= 0) {
    return -1;
  }
  text[n] = '\0';
  char* end = nullptr;
  std::strtoll(text, &end, 10);  // "size resident shared ...", in pages: the second
  const int64_t pages = std::strtoll(end, &end, 10);
  static const int64_t page_bytes = sysconf(_SC_PAGESIZE);
  return pages * page_bytes;
}

// the RSS read here at a step's end, as StepMemory.step_ends reads it on a job without CUDA;
// false where the profiler's Python must (the job uses CUDA, whose figures it reads too, or
// /proc cannot be read)
bool rss_read(PyObject* cuda_module_dict, int64_t step, int64_t t) {
  static PyObject* initialized = PyUnicode_InternFromString("_initialized");
  if (PyDict_GetItem(cuda_module_dict, initialized) == Py_True) {  // torch.cuda.is_initialized()
    return false;
  }
  const int64_t bytes = resident_bytes();
  if (bytes < 0) {
    return false;
  }
  write_row(rss, step, t, bytes);
  state[kRssDue] = t + state[kRssEvery];
  return true;
}

// how end_step went: done, or failed (the Python error set) before or after it changed anything
enum class Ended { kDone, kFailedUntouched, kFailedPartly };

// Profiler.step; its context: (the profiler's __dict__, its extras(step, t) -> where the next
// step starts, native_step_failed(exc), Profiler.step bound to it, torch.cuda's __dict__).
// What can fail comes before the step changes anything, so that Profiler.step can end it whole
// instead.
Ended end_step(PyObject* context) {
  const int64_t t = now_ns();
  PyObject* attrs = PyTuple_GET_ITEM(context, 0);
  PyObject* active = PyDict_GetItemWithError(attrs, keys().active);  // borrowed
  if (active != Py_True) {  // not recording: nothing to do
    return active != nullptr || !PyErr_Occurred() ? Ended::kDone : Ended::kFailedUntouched;
  }
  PyObject* begun = PyDict_GetItemWithError(attrs, keys().step_start_ns);
  const int64_t start = begun != nullptr ? PyLong_AsLongLong(begun) : -1;
  if (start == -1 && (begun == nullptr || PyErr_Occurred())) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_AttributeError, "step_start_ns");
    }
    return Ended::kFailedUntouched;
  }
  const int64_t step = state[kStep];
  int64_t next_start = t;  // the next step starts after dtprof's own work (see Profiler.step)
  const bool rss_due = t >= state[kRssDue];
  if (rss_due && t < state[kExtrasDue] && rss_read(PyTuple_GET_ITEM(context, 4), step, t)) {
    next_start = now_ns();
  } else if (rss_due || t >= state[kExtrasDue]) {
    PyObject* ended = PyObject_CallFunction(PyTuple_GET_ITEM(context, 1), "LL",
                                            static_cast<long long>(step),
                                            static_cast<long long>(t));
    if (ended == nullptr) {
      return Ended::kFailedUntouched;
    }
    next_start = PyLong_AsLongLong(ended);
    Py_DECREF(ended);
    if (next_start == -1 && PyErr_Occurred()) {
      return Ended::kFailedUntouched;
    }
  }
  write_row(steps, step, start, t);
  counts_move_on(step, next_start);
  dtprof_buckets_step_is(step + 1);
  const bool stored = store(attrs, keys().step_index, step + 1) &&
                      store(attrs, keys().step_start_ns, next_start);
  return stored ? Ended::kDone : Ended::kFailedPartly;
}

// profiler_step(): a failure goes to the profiler's native_step_failed(exc), which switches the
// phases off, and this with them; where it came before the step changed anything, Profiler.step
// ends the step. It raises into the training step only what Profiler.step itself would.
PyObject* profiler_step(PyObject* context, PyObject* /*unused*/) {
  const Ended ended = end_step(context);
  if (ended == Ended::kDone) {
    Py_RETURN_NONE;
  }
  said_to(PyTuple_GET_ITEM(context, 2));
  if (ended == Ended::kFailedUntouched) {
    return PyObject_CallNoArgs(PyTuple_GET_ITEM(context, 3));
  }
  Py_RETURN_NONE;
}

PyMethodDef step_ends_def = {
    "step_ends",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(step_ends)),
    METH_FASTCALL,
    "A step ends: its counts into their ring; the next step's number and data phase begin."};

PyMethodDef profiler_step_def = {"step", profiler_step, METH_NOARGS,
                                  "End the current training step (Profiler.step, natively)."};

PyMethodDef optimizer_pre_def = {
    "optimizer_pre",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(optimizer_pre)),
    METH_FASTCALL,
    "The optimizer's step pre-hook: its phase begins."};

PyMethodDef optimizer_post_def = {
    "optimizer_post",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(optimizer_post)),
    METH_FASTCALL,
    "The optimizer's step post-hook: its phase ends."};

}  // namespace

extern "C" {

// the builtin watch_backward, for Python (a new reference)
PyObject* dtprof_backward_watcher() { return PyCFunction_New(&watch_def, nullptr); }

// the ForwardTimer type (a new reference)
PyObject* dtprof_forward_timer_type() { return PyType_FromSpec(&forward_spec); }

// the optimizer's step hooks (new references); the pre-hook hands a step given arguments to
// closure_given(args, kwargs), whose result it returns
PyObject* dtprof_optimizer_pre_hook(PyObject* closure_given) {
  return PyCFunction_New(&optimizer_pre_def, closure_given);
}
PyObject* dtprof_optimizer_post_hook() { return PyCFunction_New(&optimizer_post_def, nullptr); }

// the builtin step_ends (a new reference)
PyObject* dtprof_step_ender() { return PyCFunction_New(&step_ends_def, nullptr); }

// the builtin profiler_step for one profiler (a new reference); context: (its __dict__,
// extras(step, t) -> int, native_step_failed(exc), Profiler.step bound to it, torch.cuda's
// __dict__)
PyObject* dtprof_profiler_stepper(PyObject* context) {
  return PyCFunction_New(&profiler_step_def, context);
}

// the rings' addresses, for Python's view of them
int64_t dtprof_phases_ring() { return reinterpret_cast<int64_t>(&ring); }
int64_t dtprof_counts_ring() { return reinterpret_cast<int64_t>(&counts); }
int64_t dtprof_steps_ring() { return reinterpret_cast<int64_t>(&steps); }
int64_t dtprof_rss_ring() { return reinterpret_cast<int64_t>(&rss); }

// the rows written so far: every row below this count is complete
int64_t dtprof_phases_written() { return ring.written.load(std::memory_order_acquire); }
int64_t dtprof_counts_written() { return counts.written.load(std::memory_order_acquire); }
int64_t dtprof_steps_written() { return steps.written.load(std::memory_order_acquire); }
int64_t dtprof_rss_written() { return rss.written.load(std::memory_order_acquire); }

// the shared numbers' address (kFields of them)
int64_t dtprof_phases_state() { return reinterpret_cast<int64_t>(&state[0]); }

}  // extern "C"
