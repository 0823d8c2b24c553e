// Each half of the sparse extension registers its own classes on the module.
#pragma once
#include <pybind11/pybind11.h>

namespace cpu_dist::python {
void bind_server(pybind11::module_& m);  // bind_server.cc
void bind_client(pybind11::module_& m);  // bind_client.cc
}  // namespace cpu_dist::python
