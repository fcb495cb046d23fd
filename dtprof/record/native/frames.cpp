// A live segment's frame (dtprof/trace/live.py) made in one call from rows of 64-bit integers:
// the native kernel's rings and records, as the writer's tick takes them.
//
// Made with numpy, a frame cost the tick one operation a column (a column picked out of the
// rows, packed at its width, a constant's codes, each a few µs when run once a second, cold):
// about 150 µs a tick for the phases' three tables, as much again for DDP's buckets.
// frame_of(rows, plan) -> bytes does all of it in one pass. ``rows``: a C-contiguous buffer of
// n rows of ``width`` int64 (a numpy array of shape (n, width)); ``plan``: a tuple, the frame's
// MessagePack in order, each item either
//
// - bytes, copied as they are (MessagePack the caller encoded: the array's header, a coded
//   column's map and its values, nil), or
// - (column, width): a MessagePack binary of the rows' ``column`` packed little-endian as
//   int64 (8), int32 (4), int16 (2) or float64 (-8, the integer's value as a float); column
//   -1: zeros (a constant's codes).
//
// live.plan() writes plans; the reader cannot tell these frames from live.frame()'s.

#include <Python.h>

#include <cstdint>
#include <cstring>
#include <vector>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "frames are little-endian");

namespace {

// one item of a plan: bytes to copy (literal), or the rows' column packed at width
struct Item {
  PyObject* literal;  // borrowed from the plan; nullptr: a packed column
  int64_t column;
  int width;  // 8, 4, 2; -8: float64
};

// the bytes of a packed column's n values
int64_t packed_bytes(const Item& item, int64_t n) {
  return n * (item.width < 0 ? -item.width : item.width);
}

// the bytes an item puts in the frame of n rows
int64_t size_of(const Item& item, int64_t n) {
  if (item.literal != nullptr) {
    return PyBytes_GET_SIZE(item.literal);
  }
  return 5 + packed_bytes(item, n);  // bin 32: its marker, its length, the values
}

// the plan's items, checked: false (a Python error set) on an item of another form
bool read_plan(PyObject* plan, int64_t row_width, std::vector<Item>* items) {
  if (!PyTuple_Check(plan)) {
    PyErr_SetString(PyExc_TypeError, "frame_of: the plan is a tuple");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(plan); ++i) {
    PyObject* item = PyTuple_GET_ITEM(plan, i);
    if (PyBytes_Check(item)) {
      items->push_back({item, 0, 0});
      continue;
    }
    long long column = 0;
    int width = 0;
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "Li", &column, &width)) {
      PyErr_SetString(PyExc_TypeError, "frame_of: a plan's item is bytes or (column, width)");
      return false;
    }
    if (column < -1 || column >= row_width || (width != 8 && width != 4 && width != 2 &&
                                               width != -8)) {
      PyErr_Format(PyExc_ValueError, "frame_of: no column %lld of width %d in rows of %lld",
                   column, width, static_cast<long long>(row_width));
      return false;
    }
    items->push_back({nullptr, column, width});
  }
  return true;
}

char* put_be32(char* out, uint32_t value) {
  out[0] = static_cast<char>(value >> 24);
  out[1] = static_cast<char>(value >> 16);
  out[2] = static_cast<char>(value >> 8);
  out[3] = static_cast<char>(value);
  return out + 4;
}

// one column as a MessagePack bin 32: its marker, its length, then its values
char* put_column(char* out, const int64_t* rows, int64_t n, int64_t row_width, const Item& how) {
  const int64_t bytes = packed_bytes(how, n);
  *out++ = static_cast<char>(0xc6);
  out = put_be32(out, static_cast<uint32_t>(bytes));
  if (how.column < 0) {
    std::memset(out, 0, static_cast<size_t>(bytes));
    return out + bytes;
  }
  const int64_t* value = rows + how.column;
  for (int64_t i = 0; i < n; ++i, value += row_width) {
    switch (how.width) {
      case 8:
        std::memcpy(out, value, 8);
        break;
      case 4: {
        const auto narrow = static_cast<int32_t>(*value);
        std::memcpy(out, &narrow, 4);
        break;
      }
      case 2: {
        const auto narrow = static_cast<int16_t>(*value);
        std::memcpy(out, &narrow, 2);
        break;
      }
      default: {
        const auto real = static_cast<double>(*value);
        std::memcpy(out, &real, 8);
      }
    }
    out += how.width < 0 ? 8 : how.width;
  }
  return out;
}

PyObject* frame_of(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "frame_of(rows, plan)");
    return nullptr;
  }
  Py_buffer view;
  if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
    return nullptr;
  }
  PyObject* out = nullptr;
  if (view.ndim != 2 || view.itemsize != 8 || view.format == nullptr ||
      (std::strcmp(view.format, "l") != 0 && std::strcmp(view.format, "q") != 0 &&
       std::strcmp(view.format, "<q") != 0 && std::strcmp(view.format, "<l") != 0)) {
    PyErr_SetString(PyExc_TypeError, "frame_of: the rows are a 2-D buffer of int64");
    PyBuffer_Release(&view);
    return nullptr;
  }
  const int64_t n = view.shape[0];
  const int64_t row_width = view.shape[1];
  const auto* rows = static_cast<const int64_t*>(view.buf);
  std::vector<Item> items;
  if (read_plan(args[1], row_width, &items)) {
    int64_t size = 0;
    for (const Item& item : items) {
      size += size_of(item, n);
    }
    if (size > UINT32_MAX) {
      PyErr_SetString(PyExc_OverflowError, "frame_of: a frame of 4 GiB or more");
    } else {
      out = PyBytes_FromStringAndSize(nullptr, 4 + size);
    }
    if (out != nullptr) {
      char* at = PyBytes_AS_STRING(out);
      const auto length = static_cast<uint32_t>(size);
      std::memcpy(at, &length, 4);  // the frame's length, little-endian
      at += 4;
      for (const Item& item : items) {
        if (item.literal != nullptr) {
          const int64_t bytes = size_of(item, n);
          std::memcpy(at, PyBytes_AS_STRING(item.literal), static_cast<size_t>(bytes));
          at += bytes;
        } else {
          at = put_column(at, rows, n, row_width, item);
        }
      }
    }
  }
  PyBuffer_Release(&view);
  return out;
}

PyMethodDef frame_def = {
    "frame_of",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(frame_of)),
    METH_FASTCALL,
    "A live segment's frame from rows of int64 and a plan (dtprof/trace/live.py's plan())."};

}  // namespace

extern "C" {

// the builtin frame_of, for Python (a new reference)
PyObject* dtprof_frame_maker() { return PyCFunction_New(&frame_def, nullptr); }

}  // extern "C"
