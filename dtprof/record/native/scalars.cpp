// A logged tensor's value, read from its memory: the native form of Tensor.item() for
// prof.log() (dtprof/record/profiler.py).
//
// item() goes through torch's dispatcher twice (item, then _local_scalar_dense); right after a
// step's compute that path runs cold, about 12 µs on this project's machine, more than the
// rest of logging a loss. read_scalar(tensor) reads a plain CPU tensor of one element of a real
// dtype straight from its storage, and calls tensor.item() for anything else: a Python
// subclass, a wrapper (functorch, functionalization) or a tensor without storage, a sparse or
// complex one, a negated view. Like watch_backward, it is a plain Python builtin, fetched once
// through ctypes (dtprof_scalar_reader()): a call through ctypes or a torch operator would cost
// what it saves.

#include <Python.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <optional>
#include <typeinfo>

namespace {

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

}  // namespace

extern "C" {

// the builtin read_scalar, for Python (a new reference)
PyObject* dtprof_scalar_reader() { return PyCFunction_New(&read_def, nullptr); }

}  // extern "C"
