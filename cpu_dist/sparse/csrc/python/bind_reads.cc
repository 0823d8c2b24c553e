// cpu_dist.sparse._ps_client.mark_written / interleave_rows / fill_rows: early_rows.h for
// reads.py's EarlyPull and the sole writer's reads, with the GIL released around each pass.
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "early_rows.h"

namespace cpu_dist::python {

namespace {

using MaskArray = py::array_t<bool, py::array::c_style | py::array::forcecast>;

void check_rising(const KeysArray& keys, const std::string& name) {
  const int64_t* k = keys.data();
  for (py::ssize_t j = 1; j < keys.shape(0); ++j)
    if (k[j] <= k[j - 1])
      throw py::value_error(name + " must be sorted ascending and distinct: position " +
                            std::to_string(j) + " holds " + std::to_string(k[j]) + " after " +
                            std::to_string(k[j - 1]));
}

py::array_t<bool> mark(const py::handle& keys_obj, const py::handle& written_obj) {
  KeysArray keys = as_keys(keys_obj), written = as_keys(written_obj);
  check_rising(written, "written");
  const int64_t* w = written.data();
  const size_t m = static_cast<size_t>(written.shape(0));
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

py::array_t<float> fill(const py::handle& keys_obj, const py::handle& rest_obj,
                        const py::list& held_obj) {
  KeysArray keys = as_keys(keys_obj);
  check_rising(keys, "keys");
  RowsArray rest = rows_2d(rest_obj, "rest");
  const py::ssize_t n = keys.shape(0), dim = rest.shape(1);
  // The converted arrays stay alive for the pass; their data does not move with the vectors.
  std::vector<KeysArray> held_keys;
  std::vector<RowsArray> held_rows;
  std::vector<ps::HeldRows> levels;
  for (size_t l = 0; l < held_obj.size(); ++l) {
    const auto pair = held_obj[l].cast<py::tuple>();
    if (pair.size() != 2) throw py::value_error("held: each level is a (keys, rows) pair");
    const std::string name = "held[" + std::to_string(l) + "]";
    const KeysArray& k = held_keys.emplace_back(as_keys(pair[0]));
    check_rising(k, name + " keys");
    const RowsArray& r = held_rows.emplace_back(rows_2d(pair[1], (name + " rows").c_str()));
    if (r.shape(0) != k.shape(0) || r.shape(1) != dim)
      throw py::value_error(name + ": rows " + shape_str(r) + " for " + std::to_string(k.shape(0)) +
                            " keys, width " + std::to_string(dim) + " expected");
    levels.push_back({k.data(), static_cast<size_t>(k.shape(0)), r.data()});
  }
  py::array_t<float> out({n, dim});
  size_t used = 0;
  {
    py::gil_scoped_release release;
    used = ps::fill_rows(keys.data(), static_cast<size_t>(n), levels.data(), levels.size(),
                         rest.data(), static_cast<size_t>(rest.shape(0)), static_cast<size_t>(dim),
                         out.mutable_data());
  }
  if (used != static_cast<size_t>(rest.shape(0)))
    throw py::value_error("rest " + shape_str(rest) + " must hold the rows of the " +
                          std::to_string(used) + " keys that no level of held holds");
  return out;
}

}  // namespace

void bind_reads(py::module_& m) {
  m.def("mark_written", &mark, py::arg("keys"), py::arg("written"),
        "Bool per key: whether it is in `written` (int64, sorted ascending, distinct; "
        "ValueError otherwise).  One merge pass where `keys` are sorted.");
  m.def("interleave_rows", &interleave, py::arg("written"), py::arg("late"), py::arg("early"),
        "float32 [n, dim]: row i the next row of `late` where written[i], of `early` otherwise.");
  m.def("fill_rows", &fill, py::arg("keys"), py::arg("rest"), py::arg("held"),
        "float32 [n, dim]: row i the row of keys[i] in the first (keys, rows) level of `held` "
        "that holds it, else the next row of `rest`.  All keys sorted ascending and distinct.");
}

}  // namespace cpu_dist::python
