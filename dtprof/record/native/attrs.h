// The profiler's attributes as the native sources write them: in its __dict__, where Python
// reads them as ever.
#pragma once

#include <Python.h>

#include <cstdint>

namespace dtprof {

// attrs[key] = value (false: failed, the Python error set)
inline bool store(PyObject* attrs, PyObject* key, int64_t value) {
  PyObject* number = PyLong_FromLongLong(value);
  const bool stored = number != nullptr && PyDict_SetItem(attrs, key, number) == 0;
  Py_XDECREF(number);
  return stored;
}

}  // namespace dtprof
