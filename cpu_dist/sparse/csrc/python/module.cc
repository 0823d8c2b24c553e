// cpu_dist.sparse._ps: the parameter server and its client, bound for Python.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "hashing.h"

namespace py = pybind11;

PYBIND11_MODULE(_ps, m) {
  m.doc() = "C++ parameter server (gRPC) and its client";
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
  cpu_dist::python::bind_server(m);
  cpu_dist::python::bind_client(m);
}
