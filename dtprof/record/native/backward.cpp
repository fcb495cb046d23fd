// The backward phase timed in C++: the native form of the hooks dtprof/record/phases.py puts
// on a model's output (read that first; this file does the same with no Python in the pass).
//
// watch_backward(), called from the model's forward hook with the output tensor's address
// (Tensor._cdata) and the step, adds a pre-hook to the autograd node that made it. When the
// gradient reaches that node (the first of the pass, if several outputs are watched), the hook
// notes the time and queues a callback on the autograd engine for the end of the pass; the
// callback writes the pass (step, start, end) into a ring that Python reads through plain
// memory, on dtprof's writer thread at each tick and at the profile's end, after
// dtprof_backward_written(), whose acquire load makes every row below the count it returns
// complete. In Python the same pre-hook costs a registration through torch's Python hook
// machinery and a call into Python (with the GIL) in the middle of the pass: most of
// recording's fixed cost per step. watch_backward is a plain Python builtin (made by
// dtprof_backward_watcher(), which Python fetches once through ctypes), as cheap to call as
// any: a call through ctypes or a torch operator costs several times more.
//
// A pass whose backward raised never reaches its end: the next forward pass outside a backward
// forgets it (watch), so that the passes after it are timed.
//
// Under compiled autograd the hook is skipped (it tells the compiler nothing), so the pass
// has no span there; it never makes the user's backward fail.

#include <Python.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>

#include "clock.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

namespace {

using dtprof::now_ns;

constexpr int64_t kRing = 16384;  // passes Python may fall behind by before losing some

struct Ring {
  std::atomic<int64_t> written;  // passes written so far; pass i is at rows[i % kRing]
  int64_t rows[kRing][3];  // step, start_ns, end_ns
};

struct Pass {
  int64_t step, start_ns;
};

Ring ring{};
std::mutex mu;  // guards `open`
std::optional<Pass> open;  // the pass in progress: its hook fired, its end has not come

// the engine's final callback: the end of the pass
void pass_ends() {
  const int64_t end = now_ns();
  std::optional<Pass> pass;
  {
    std::lock_guard<std::mutex> guard(mu);
    pass.swap(open);
  }
  if (!pass) {
    return;
  }
  const int64_t i = ring.written.load(std::memory_order_relaxed);
  int64_t* row = ring.rows[i % kRing];
  row[0] = pass->step;
  row[1] = pass->start_ns;
  row[2] = end;
  ring.written.store(i + 1, std::memory_order_release);
}

struct PassBegins final : torch::autograd::FunctionPreHook {
  explicit PassBegins(int64_t step) : step(step) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& grads) override {
    try {
      bool first = false;
      {
        std::lock_guard<std::mutex> guard(mu);
        if (!open) {
          open = Pass{step, now_ns()};
          first = true;
        }
      }
      if (first) {
        torch::autograd::Engine::get_default_engine().queue_callback(pass_ends);
      }
    } catch (...) {  // no span for this pass, never a failed backward
      std::lock_guard<std::mutex> guard(mu);
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
int watch(int64_t tensor_impl, int64_t step) {
  try {
    if (torch::autograd::get_current_graph_task_id() == -1) {
      // a forward pass outside any backward: a pass still open is one that raised (its end
      // never came), and would keep every later pass from being timed
      std::lock_guard<std::mutex> guard(mu);
      open.reset();
    }
    auto* impl = reinterpret_cast<c10::TensorImpl*>(tensor_impl);
    const at::Tensor tensor(
        c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl));
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
  const int64_t impl = PyLong_AsLongLong(args[0]);
  const int64_t step = PyLong_AsLongLong(args[1]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  return PyBool_FromLong(impl != 0 && watch(impl, step) == 1);
}

PyMethodDef watch_def = {
    "watch_backward",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(watch_backward)),
    METH_FASTCALL,
    "Time the backward pass that reaches this tensor's autograd node, as this step's."};

}  // namespace

extern "C" {

// the builtin watch_backward, for Python (a new reference)
PyObject* dtprof_backward_watcher() { return PyCFunction_New(&watch_def, nullptr); }

// the ring's address, for Python's view of it
int64_t dtprof_backward_ring() { return reinterpret_cast<int64_t>(&ring); }

// the passes written so far: every row below this count is complete
int64_t dtprof_backward_written() { return ring.written.load(std::memory_order_acquire); }

}  // extern "C"
