// prof.region(name) natively: the native form of dtprof/record/profiler.py's Profiler.region
// and _Region (read those first).
//
// A region runs cold, between the step's kernels, where Python's four calls (region, the
// object's making, __enter__, __exit__) cost about 6 µs a region (benchmarks/hook_time.py).
// profiler_region(name), which the profiler sets as its own ``region`` where the kernel is
// loaded, makes a Region, a plain object whose __enter__ and __exit__ are C: the depth read and
// written in the profiler's __dict__ as _Region does, the span appended to the spans table at
// the exit. A profiler that is not recording, one that times regions on the GPU (``gpu_timer``
// set: _Region records CUDA events) and one whose native region has failed get Profiler.region
// instead. A failure inside goes to region_failed(exc), never into the user's block.

#include <Python.h>

#include "attrs.h"
#include "clock.h"
#include "failure.h"

#include <cstdint>

namespace {

using dtprof::now_ns;
using dtprof::said_to;
using dtprof::store;

// the profiler's attributes a region reads and writes, as keys of its __dict__, and the span's
// kind
struct Keys {
  PyObject *active, *gpu_timer, *depth, *step_index, *region;
};

const Keys& keys() {
  static const Keys k{PyUnicode_InternFromString("active"),
                      PyUnicode_InternFromString("gpu_timer"),
                      PyUnicode_InternFromString("_region_depth"),
                      PyUnicode_InternFromString("step_index"),
                      PyUnicode_InternFromString("region")};
  return k;
}

// a region's context: (the profiler's __dict__, its _switched_off, its spans table's append,
// Profiler.region bound to it, region_failed(exc))
enum Context { kAttrs, kSwitchedOff, kAppend, kPythonRegion, kFailed };

struct Region {
  PyObject_HEAD PyObject* context;
  PyObject* name;
  PyObject* depth;  // the depth it was entered at; nullptr before its entry, or where it failed
  int64_t start;
};

void region_dealloc(PyObject* object) {
  auto* self = reinterpret_cast<Region*>(object);
  Py_XDECREF(self->context);
  Py_XDECREF(self->name);
  Py_XDECREF(self->depth);
  PyTypeObject* type = Py_TYPE(object);
  type->tp_free(object);
  Py_DECREF(type);
}

// attrs[key] += step (false: failed, the Python error set)
bool add_to(PyObject* attrs, PyObject* key, int64_t step) {
  PyObject* now = PyDict_GetItemWithError(attrs, key);  // borrowed
  if (now == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetObject(PyExc_AttributeError, key);
    }
    return false;
  }
  const int64_t value = PyLong_AsLongLong(now);
  if (value == -1 && PyErr_Occurred()) {
    return false;
  }
  return store(attrs, key, value + step);
}

// __enter__: one level deeper, the start noted
PyObject* region_enter(PyObject* object, PyObject* /*unused*/) {
  auto* self = reinterpret_cast<Region*>(object);
  PyObject* attrs = PyTuple_GET_ITEM(self->context, kAttrs);
  PyObject* depth = PyDict_GetItemWithError(attrs, keys().depth);  // borrowed
  Py_XINCREF(depth);  // kept through the store below, which drops the dict's reference
  if (depth == nullptr || !add_to(attrs, keys().depth, 1)) {
    if (!PyErr_Occurred()) {
      PyErr_SetObject(PyExc_AttributeError, keys().depth);
    }
    Py_XDECREF(depth);
    said_to(PyTuple_GET_ITEM(self->context, kFailed));
    Py_RETURN_NONE;
  }
  Py_XSETREF(self->depth, depth);
  self->start = now_ns();
  Py_RETURN_NONE;
}

// __exit__(type, value, traceback): one level up, the span appended; never swallows the
// block's exception
PyObject* region_exit(PyObject* object, PyObject* const* /*args*/, Py_ssize_t /*nargs*/) {
  const int64_t end = now_ns();
  auto* self = reinterpret_cast<Region*>(object);
  if (self->depth == nullptr) {  // never entered, or its entry failed
    Py_RETURN_NONE;
  }
  PyObject* attrs = PyTuple_GET_ITEM(self->context, kAttrs);
  PyObject* step = nullptr;
  PyObject *start = nullptr, *stop = nullptr, *row = nullptr, *appended = nullptr;
  if (add_to(attrs, keys().depth, -1)) {
    step = PyDict_GetItemWithError(attrs, keys().step_index);
    Py_XINCREF(step);  // held: making the row may run a collection, and its finalizers
    start = step != nullptr ? PyLong_FromLongLong(self->start) : nullptr;
    stop = start != nullptr ? PyLong_FromLongLong(end) : nullptr;
    row = stop != nullptr ? PyTuple_Pack(8, step, self->name, keys().region, start, stop,
                                         self->depth, Py_None, Py_None)
                          : nullptr;
    appended = row != nullptr ? PyObject_CallOneArg(PyTuple_GET_ITEM(self->context, kAppend), row)
                              : nullptr;
  }
  Py_XDECREF(step);
  Py_XDECREF(start);
  Py_XDECREF(stop);
  Py_XDECREF(row);
  Py_CLEAR(self->depth);
  if (appended == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetObject(PyExc_AttributeError, keys().step_index);
    }
    said_to(PyTuple_GET_ITEM(self->context, kFailed));
    Py_RETURN_NONE;
  }
  Py_DECREF(appended);
  Py_RETURN_NONE;
}

PyMethodDef region_methods[] = {
    {"__enter__", region_enter, METH_NOARGS, "The region begins."},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(region_exit)),
     METH_FASTCALL, "The region ends: its span into the trace."},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot region_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(region_dealloc)},
    {Py_tp_methods, region_methods},
    {Py_tp_doc, const_cast<char*>("A user region, timed in C++: _Region's native form.")},
    {0, nullptr}};

PyType_Spec region_spec = {"dtprof_native.Region", sizeof(Region), 0, Py_TPFLAGS_DEFAULT,
                           region_slots};

PyTypeObject* region_type = nullptr;  // made at the first dtprof_profiler_regioner

// profiler_region(name): a Region, or what Profiler.region gives where this does not time it
PyObject* profiler_region(PyObject* context, PyObject* name) {
  PyObject* attrs = PyTuple_GET_ITEM(context, kAttrs);
  PyObject* active = PyDict_GetItemWithError(attrs, keys().active);  // borrowed
  PyObject* timer = PyDict_GetItemWithError(attrs, keys().gpu_timer);
  const int failed_before = PySet_Contains(PyTuple_GET_ITEM(context, kSwitchedOff), keys().region);
  if (active != Py_True || timer != Py_None || failed_before != 0) {
    PyErr_Clear();
    return PyObject_CallOneArg(PyTuple_GET_ITEM(context, kPythonRegion), name);
  }
  auto* self = PyObject_New(Region, region_type);
  if (self == nullptr) {
    return nullptr;
  }
  Py_INCREF(context);  // PyObject_New took a reference to the heap type, which dealloc drops
  Py_INCREF(name);
  self->context = context;
  self->name = name;
  self->depth = nullptr;
  self->start = 0;
  return reinterpret_cast<PyObject*>(self);
}

PyMethodDef region_def = {"region", profiler_region, METH_O,
                          "A named user region inside a step (Profiler.region, natively)."};

}  // namespace

extern "C" {

// the builtin profiler_region for one profiler (a new reference; nullptr, the Python error
// set, where its type cannot be made); context: (its __dict__, its _switched_off, its spans
// table's append, Profiler.region bound to it, region_failed(exc))
PyObject* dtprof_profiler_regioner(PyObject* context) {
  if (region_type == nullptr) {
    region_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&region_spec));
    if (region_type == nullptr) {
      return nullptr;
    }
  }
  return PyCFunction_New(&region_def, context);
}

}  // extern "C"
