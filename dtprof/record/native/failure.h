// How the native sources hand a failure to Python: a failure in recording never reaches the
// training step.
#pragma once

#include <Python.h>

namespace dtprof {

// the Python error set, handed to ``failed(exc)`` (Python, which switches the hook off and
// says so) and cleared
inline void said_to(PyObject* failed) {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (value != nullptr && traceback != nullptr) {
    PyException_SetTraceback(value, traceback);
  }
  PyObject* said = PyObject_CallOneArg(failed, value != nullptr ? value : Py_None);
  Py_XDECREF(said);
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
}

}  // namespace dtprof
