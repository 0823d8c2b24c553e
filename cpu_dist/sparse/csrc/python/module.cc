// cpu_dist.sparse._ps: the parameter server bound for Python, and (re-exported) its client.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bindings.h"
#include "hashing.h"
#include "row_update.h"

namespace py = pybind11;

namespace {

// An argument updated in place: a writeable C-contiguous float32 numpy array, else TypeError
// naming it (never a converted copy that the update would change instead).
py::array in_place_float32(const py::object& obj, const char* name) {
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(std::string("apply_rows: ") + name +
                         " must be a numpy float32 array (it is updated in place)");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<float>()))
    throw py::type_error(std::string("apply_rows: ") + name + " must be float32, got " +
                         std::string(py::str(a.dtype())) + " (it is updated in place)");
  if (!(a.flags() & py::array::c_style))
    throw py::type_error(std::string("apply_rows: ") + name +
                         " must be C-contiguous (it is updated in place; a strided view would "
                         "update a copy): pass np.ascontiguousarray(...) and use the result");
  if (!a.writeable()) throw py::type_error(std::string("apply_rows: ") + name + " is read-only");
  return a;
}

}  // namespace

PYBIND11_MODULE(_ps, m) {
  m.doc() = "C++ parameter server (gRPC), and its client re-exported from _ps_client";
  m.attr("NUM_PARTITIONS") = cpu_dist::kNumPartitions;
  m.def(
      "partition_of",
      [](py::array_t<int64_t, py::array::c_style | py::array::forcecast> keys) {
        py::array_t<int64_t> out(keys.size());
        auto k = keys.unchecked<1>();
        auto o = out.mutable_unchecked<1>();
        for (py::ssize_t i = 0; i < k.shape(0); ++i) o(i) = cpu_dist::partition_of(k(i));
        return out;
      },
      "Partition of each key (see hashing.h).");
  m.def(
      "row_init",
      [](uint64_t seed, py::array_t<int64_t, py::array::c_style | py::array::forcecast> keys,
         uint32_t dim, float scale) {
        py::array_t<float> out({keys.size(), static_cast<py::ssize_t>(dim)});
        auto k = keys.unchecked<1>();
        auto o = out.mutable_unchecked<2>();
        for (py::ssize_t i = 0; i < k.shape(0); ++i)
          for (uint32_t c = 0; c < dim; ++c) o(i, c) = cpu_dist::row_init(seed, k(i), c, scale);
        return out;
      },
      "First-touch rows as the parameter server creates them (see hashing.h).");
  m.def(
      "apply_rows",
      [](const py::object& rows_obj,
         py::array_t<float, py::array::c_style | py::array::forcecast> sums, double lr,
         const std::string& optimizer, double divisor, const py::object& states_obj, double eps) {
        const auto kind = cpu_dist::ps::optimizer_from_name(optimizer);
        if (!kind) throw py::value_error("optimizer must be 'sgd', 'rowwise_adagrad' or 'adagrad'");
        // Updated in place: a copy (another dtype, a strided view) would be updated and lost.
        py::array rows = in_place_float32(rows_obj, "rows");
        if (rows.ndim() != 2 || sums.ndim() != 2 || rows.shape(0) != sums.shape(0) ||
            rows.shape(1) != sums.shape(1))
          throw py::value_error("apply_rows: rows and sums must be float32 [n, dim] alike");
        const auto n = rows.shape(0);
        float* st = nullptr;
        std::optional<py::array> states;
        if (!states_obj.is_none()) {
          states = in_place_float32(states_obj, "states");
          if (*kind == cpu_dist::ps::OptimizerKind::kAdagrad) {
            if (states->ndim() != 2 || states->shape(0) != n || states->shape(1) != rows.shape(1))
              throw py::value_error("apply_rows: adagrad's states must be float32 [n, dim]");
          } else if (states->ndim() != 1 || states->shape(0) != n) {
            throw py::value_error("apply_rows: states must be float32 [n]");
          }
          st = static_cast<float*>(states->mutable_data());
        }
        float* r = static_cast<float*>(rows.mutable_data());
        const float* g = sums.data();
        py::gil_scoped_release release;
        cpu_dist::ps::apply_summed_rows(
            *kind, static_cast<float>(lr), static_cast<float>(divisor), g, r, st,
            static_cast<size_t>(n), static_cast<uint32_t>(rows.shape(1)), static_cast<float>(eps));
      },
      py::arg("rows"), py::arg("sums"), py::arg("lr"), py::arg("optimizer"),
      py::arg("divisor") = 1.0, py::arg("states") = py::none(),
      py::arg("eps") = static_cast<double>(cpu_dist::ps::kDefaultAdagradEps),
      "In place: rows (and states) as a commit changes them on the parameter server, given "
      "the step's summed gradient rows and its world size as divisor (see row_update.h).");
  cpu_dist::python::bind_server(m);
  // The client is its own extension (_ps_client, module_client.cc: no RocksDB, no ISA-L); its
  // names are this module's too, so `from cpu_dist.sparse._ps import Client` keeps working.
  const py::dict client = py::module_::import("cpu_dist.sparse._ps_client").attr("__dict__");
  for (const auto& [name, value] : client)
    if (py::cast<std::string>(name).rfind("__", 0) != 0) m.attr(name) = value;
}
