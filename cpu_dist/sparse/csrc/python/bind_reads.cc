// cpu_dist.sparse._ps_client.mark_written / interleave_rows: early_rows.h for reads.py's
// EarlyPull, with the GIL released around each pass.
#include <cstdint>
#include <string>

#include "bindings.h"
#include "convert.h"
#include "early_rows.h"

namespace cpu_dist::python {

namespace {

using MaskArray = py::array_t<bool, py::array::c_style | py::array::forcecast>;

py::array_t<bool> mark(const py::handle& keys_obj, const py::handle& written_obj) {
  KeysArray keys = as_keys(keys_obj), written = as_keys(written_obj);
  const int64_t* w = written.data();
  const size_t m = static_cast<size_t>(written.shape(0));
  for (size_t j = 1; j < m; ++j)
    if (w[j] <= w[j - 1])
      throw py::value_error("written must be sorted ascending and distinct: position " +
                            std::to_string(j) + " holds " + std::to_string(w[j]) + " after " +
                            std::to_string(w[j - 1]));
  py::array_t<bool> out(keys.shape(0));
  {
    py::gil_scoped_release release;
    ps::mark_written(keys.data(), static_cast<size_t>(keys.shape(0)), w, m,
                     reinterpret_cast<uint8_t*>(out.mutable_data()));
  }
  return out;
}

RowsArray rows_2d(const py::handle& obj, const char* name) {
  RowsArray a = RowsArray::ensure(obj);
  if (!a) throw py::error_already_set();
  if (a.ndim() != 2)
    throw py::value_error(std::string(name) + " must be a 2-D array, got shape " + shape_str(a));
  return a;
}

py::array_t<float> interleave(const py::handle& mask_obj, const py::handle& late_obj,
                              const py::handle& early_obj) {
  MaskArray mask = MaskArray::ensure(mask_obj);
  if (!mask || mask.ndim() != 1) throw py::value_error("written must be a 1-D bool array");
  RowsArray late = rows_2d(late_obj, "late"), early = rows_2d(early_obj, "early");
  const py::ssize_t n = mask.shape(0), dim = late.shape(1);
  py::ssize_t marked = 0;
  for (py::ssize_t i = 0; i < n; ++i) marked += mask.data()[i] ? 1 : 0;
  if (early.shape(1) != dim || late.shape(0) != marked || early.shape(0) != n - marked)
    throw py::value_error("late " + shape_str(late) + " and early " + shape_str(early) +
                          " must hold the " + std::to_string(marked) + " written and " +
                          std::to_string(n - marked) + " other rows of one width");
  py::array_t<float> out({n, dim});
  {
    py::gil_scoped_release release;
    ps::interleave_rows(reinterpret_cast<const uint8_t*>(mask.data()), static_cast<size_t>(n),
                        late.data(), early.data(), static_cast<size_t>(dim), out.mutable_data());
  }
  return out;
}

}  // namespace

void bind_reads(py::module_& m) {
  m.def("mark_written", &mark, py::arg("keys"), py::arg("written"),
        "Bool per key: whether it is in `written` (int64, sorted ascending, distinct; "
        "ValueError otherwise).  One merge pass where `keys` are sorted.");
  m.def("interleave_rows", &interleave, py::arg("written"), py::arg("late"), py::arg("early"),
        "float32 [n, dim]: row i the next row of `late` where written[i], of `early` otherwise.");
}

}  // namespace cpu_dist::python
