// prof.log() natively (dtprof/record/profiler.py's Profiler.log), and a logged tensor's value
// read from its memory: the native form of Tensor.item() that both forms of log use.
//
// item() goes through torch's dispatcher twice (item, then _local_scalar_dense); right after a
// step's compute that path runs cold, about 12 µs on this project's machine, more than the
// rest of logging a loss. read_scalar(tensor) reads a plain CPU tensor of one element of a real
// dtype straight from its storage, and calls tensor.item() for anything else: a Python
// subclass, a wrapper (functorch, functionalization) or a tensor without storage, a sparse or
// complex one, a negated view. Like watch_backward, it is a plain Python builtin, fetched once
// through ctypes (dtprof_scalar_reader()): a call through ctypes or a torch operator would cost
// what it saves.
//
// profiler_log(**values), which the profiler sets as its own ``log`` where the kernel is
// loaded: Profiler.log runs cold between the step's kernels, about 13 µs in place, most of it
// the Python around the read; this reads floats, ints and plain CPU scalar tensors and appends
// their rows to the scalars table itself (about 8 µs in place; benchmarks/hook_time.py), and
// hands any other call, untouched, to Profiler.log.

#include <Python.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/python_variable.h>

#include "failure.h"

#include <cstdint>
#include <optional>
#include <typeinfo>

namespace {

using dtprof::said_to;

// the value of a plain CPU tensor of one element, or nothing where item() must read it
std::optional<double> plain_value(const at::Tensor& tensor) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (typeid(*impl) != typeid(c10::TensorImpl) || impl->is_python_dispatch() ||
      impl->device_type() != c10::DeviceType::CPU || impl->layout() != c10::kStrided ||
      !impl->has_storage() || impl->is_neg() || impl->numel() != 1) {
    return std::nullopt;
  }
  const void* data = impl->data();
  if (data == nullptr) {
    return std::nullopt;
  }
  switch (impl->dtype().toScalarType()) {
    case c10::ScalarType::Float:
      return *static_cast<const float*>(data);
    case c10::ScalarType::Double:
      return *static_cast<const double*>(data);
    case c10::ScalarType::Half:
      return static_cast<float>(*static_cast<const c10::Half*>(data));
    case c10::ScalarType::BFloat16:
      return static_cast<float>(*static_cast<const c10::BFloat16*>(data));
    case c10::ScalarType::Long:
      return static_cast<double>(*static_cast<const int64_t*>(data));
    case c10::ScalarType::Int:
      return *static_cast<const int32_t*>(data);
    case c10::ScalarType::Short:
      return *static_cast<const int16_t*>(data);
    case c10::ScalarType::Char:
      return *static_cast<const int8_t*>(data);
    case c10::ScalarType::Byte:
      return *static_cast<const uint8_t*>(data);
    case c10::ScalarType::Bool:
      return *static_cast<const bool*>(data) ? 1.0 : 0.0;
    default:
      return std::nullopt;
  }
}

// read_scalar(tensor) -> float, or what tensor.item() returns where it cannot read it itself
PyObject* read_scalar(PyObject* /*self*/, PyObject* arg) {
  if (THPVariable_CheckExact(arg)) {
    std::optional<double> value;
    try {
      value = plain_value(THPVariable_Unpack(arg));
    } catch (...) {  // symbolic sizes, an unreadable storage: item() says what is wrong
    }
    if (value) {
      return PyFloat_FromDouble(*value);
    }
  }
  return PyObject_CallMethod(arg, "item", nullptr);
}

PyMethodDef read_def = {
    "read_scalar",
    read_scalar,
    METH_O,
    "tensor.item() as a float, read from the memory of a plain CPU tensor of one element."};

// ------------------------------------------------------------------ the profiler's log

constexpr Py_ssize_t kMostValues = 16;  // a call logging more goes to Profiler.log

// a logged value as a float where this reads it alone: a float, an int, a plain CPU scalar
// tensor (false, no Python error set: Profiler.log must read it)
bool plain_number(PyObject* value, double* out) {
  if (PyFloat_CheckExact(value)) {
    *out = PyFloat_AS_DOUBLE(value);
    return true;
  }
  if (PyLong_CheckExact(value)) {
    *out = PyLong_AsDouble(value);
    if (*out == -1.0 && PyErr_Occurred()) {  // too large: float(value) says so in Python
      PyErr_Clear();
      return false;
    }
    return true;
  }
  if (!THPVariable_CheckExact(value)) {
    return false;
  }
  std::optional<double> read;
  try {
    read = plain_value(THPVariable_Unpack(value));
  } catch (...) {
  }
  if (read) {
    *out = *read;
  }
  return read.has_value();
}

// whether ``name`` is one of ``work_names`` (Profiler.log's WORK_NAMES, which it notes as logged
// by the script), or cannot be told apart from them
bool work_name(PyObject* work_names, PyObject* name) {
  const int found = PySequence_Contains(work_names, name);
  if (found < 0) {
    PyErr_Clear();
  }
  return found != 0;
}

// Profiler.log(**values), natively; its context: (the profiler's __dict__, its _switched_off,
// its scalars table's append, Profiler.log bound to it, log_failed(exc), WORK_NAMES). A call
// this does not read whole (positional arguments, a work name, a value of another kind) goes,
// untouched, to Profiler.log; what fails after reading goes to log_failed, as Profiler.log's
// own failures do.
PyObject* profiler_log(PyObject* context, PyObject* const* args, size_t nargsf,
                       PyObject* kwnames) {
  static PyObject* const active_key = PyUnicode_InternFromString("active");
  static PyObject* const step_key = PyUnicode_InternFromString("step_index");
  static PyObject* const log_name = PyUnicode_InternFromString("log");
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t n = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject* attrs = PyTuple_GET_ITEM(context, 0);
  PyObject* active = PyDict_GetItemWithError(attrs, active_key);  // borrowed
  const int off = PySet_Contains(PyTuple_GET_ITEM(context, 1), log_name);
  PyObject* step = PyDict_GetItemWithError(attrs, step_key);  // borrowed
  if (PyErr_Occurred() || off < 0) {
    PyErr_Clear();
    return PyObject_Vectorcall(PyTuple_GET_ITEM(context, 3), args, nargsf, kwnames);
  }
  if (nargs == 0 && (active != Py_True || off == 1)) {
    Py_RETURN_NONE;  // not recording, or logging is off
  }
  double values[kMostValues];
  bool plain = nargs == 0 && n <= kMostValues && step != nullptr && PyLong_CheckExact(step);
  for (Py_ssize_t i = 0; plain && i < n; ++i) {
    plain = !work_name(PyTuple_GET_ITEM(context, 5), PyTuple_GET_ITEM(kwnames, i)) &&
            plain_number(args[i], &values[i]);
  }
  if (!plain) {
    return PyObject_Vectorcall(PyTuple_GET_ITEM(context, 3), args, nargsf, kwnames);
  }
  PyObject* append = PyTuple_GET_ITEM(context, 2);
  Py_INCREF(step);  // held: making the rows may run a collection, and its finalizers
  bool failed = false;
  for (Py_ssize_t i = 0; i < n && !failed; ++i) {
    PyObject* value = PyFloat_FromDouble(values[i]);
    PyObject* row = value != nullptr ? PyTuple_Pack(3, step, PyTuple_GET_ITEM(kwnames, i), value)
                                     : nullptr;
    PyObject* appended = row != nullptr ? PyObject_CallOneArg(append, row) : nullptr;
    Py_XDECREF(value);
    Py_XDECREF(row);
    Py_XDECREF(appended);
    failed = appended == nullptr;
  }
  Py_DECREF(step);
  if (failed) {  // out of memory: logging goes off, training goes on
    said_to(PyTuple_GET_ITEM(context, 4));
  }
  Py_RETURN_NONE;
}

PyMethodDef log_def = {
    "log",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(profiler_log)),
    METH_FASTCALL | METH_KEYWORDS,
    "Record named scalars for this step (Profiler.log, natively)."};

}  // namespace

extern "C" {

// the builtin read_scalar, for Python (a new reference)
PyObject* dtprof_scalar_reader() { return PyCFunction_New(&read_def, nullptr); }

// the builtin profiler_log for one profiler (a new reference); context: (its __dict__, its
// _switched_off, its scalars table's append, Profiler.log bound to it, log_failed(exc),
// WORK_NAMES)
PyObject* dtprof_profiler_logger(PyObject* context) {
  return PyCFunction_New(&log_def, context);
}

}  // extern "C"
