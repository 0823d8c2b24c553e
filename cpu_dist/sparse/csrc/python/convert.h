// Shared pieces of the Python layer: numpy argument checks and protobuf -> dict.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace cpu_dist::python {

namespace py = pybind11;
using KeysArray = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using RowsArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

inline std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape(i));
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

// Longest wait C++ is asked for (~31 years): a double this size still converts to chrono
// durations and deadlines without overflow, and nobody waits that long on purpose.
constexpr double kMaxTimeoutS = 1e9;

// The max_message_bytes keyword (client and shard alike) as gRPC takes it: an int.
inline int to_message_bytes(int64_t v) {
  if (v <= 0 || v > INT32_MAX)
    throw py::value_error("max_message_bytes must be in 1..2^31-1, got " + std::to_string(v));
  return static_cast<int>(v);
}

// A Python timeout as C++ takes it: None waits forever (-1); NaN is an error; negatives mean
// "don't wait" (0); anything huge (inf included) is capped at kMaxTimeoutS.
inline double to_timeout(std::optional<double> t, const char* name = "timeout_s") {
  if (!t) return -1.0;
  if (std::isnan(*t)) throw py::value_error(std::string(name) + " must not be NaN");
  if (*t < 0) return 0.0;
  return *t > kMaxTimeoutS ? kMaxTimeoutS : *t;
}

// Holder deleter for objects whose destructor may block (joining threads, draining calls):
// pybind11 destroys holders with the GIL held, so let it go while deleting.
template <class T>
struct GilFreeDelete {
  void operator()(T* p) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      delete p;
    } else {
      delete p;
    }
  }
};

// keys: anything numpy turns into int64 (copied when not contiguous int64); must be 1-D.
inline KeysArray as_keys(const py::handle& obj) {
  KeysArray a = KeysArray::ensure(obj);
  if (!a) throw py::error_already_set();
  if (a.ndim() != 1) throw py::value_error("keys must be a 1-D array, got shape " + shape_str(a));
  return a;
}

// grads: float32 [n, dim] (converted when needed); n must match the keys.
inline RowsArray as_grads(const py::handle& obj, py::ssize_t n, uint32_t dim) {
  RowsArray a = RowsArray::ensure(obj);
  if (!a) throw py::error_already_set();
  if (a.ndim() != 2 || a.shape(0) != n || a.shape(1) != static_cast<py::ssize_t>(dim))
    throw py::value_error("grads must have shape (" + std::to_string(n) + ", " +
                          std::to_string(dim) + ") to match keys and dim, got shape " +
                          shape_str(a));
  return a;
}

// A protobuf message's fields as a dict (field name -> int/float/bool/str; a float32 field
// becomes the Python float of exactly that value; an enum its value's name in lower case, as
// the spec dicts name optimizers; a repeated message field a list of such dicts, e.g. Stats'
// and Health's `tables`).  Other repeated fields are left out.
inline py::dict message_to_dict(const google::protobuf::Message& m) {
  py::dict d;
  const auto* desc = m.GetDescriptor();
  const auto* refl = m.GetReflection();
  using FD = google::protobuf::FieldDescriptor;
  for (int i = 0; i < desc->field_count(); ++i) {
    const FD* f = desc->field(i);
    py::str name(f->name());
    if (f->is_repeated()) {
      if (f->cpp_type() != FD::CPPTYPE_MESSAGE) continue;
      py::list items;
      for (int j = 0; j < refl->FieldSize(m, f); ++j)
        items.append(message_to_dict(refl->GetRepeatedMessage(m, f, j)));
      d[name] = items;
      continue;
    }
    switch (f->cpp_type()) {
      case FD::CPPTYPE_UINT64: d[name] = refl->GetUInt64(m, f); break;
      case FD::CPPTYPE_UINT32: d[name] = refl->GetUInt32(m, f); break;
      case FD::CPPTYPE_INT64: d[name] = refl->GetInt64(m, f); break;
      case FD::CPPTYPE_INT32: d[name] = refl->GetInt32(m, f); break;
      case FD::CPPTYPE_BOOL: d[name] = refl->GetBool(m, f); break;
      case FD::CPPTYPE_FLOAT: d[name] = refl->GetFloat(m, f); break;
      case FD::CPPTYPE_DOUBLE: d[name] = refl->GetDouble(m, f); break;
      case FD::CPPTYPE_STRING: {
        // bytes fields too (a table name): as text, never failing on invalid UTF-8.
        const std::string v = refl->GetString(m, f);
        d[name] = py::reinterpret_steal<py::str>(
            PyUnicode_DecodeUTF8(v.data(), static_cast<Py_ssize_t>(v.size()), "replace"));
        break;
      }
      case FD::CPPTYPE_ENUM: {
        std::string v = refl->GetEnum(m, f)->name();
        for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        d[name] = v;
        break;
      }
      default: break;
    }
  }
  return d;
}

// One dict per reply (one reply per shard), in shard order.
template <typename Message>
py::list messages_to_list(const std::vector<Message>& replies) {
  py::list out;
  for (const auto& r : replies) out.append(message_to_dict(r));
  return out;
}

}  // namespace cpu_dist::python
