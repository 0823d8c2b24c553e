// Each half of the sparse extension registers its own classes on the module.
#pragma once
#include <pybind11/pybind11.h>

#include <string>

#include "codec.h"

namespace cpu_dist::python {
void bind_server(pybind11::module_& m);  // bind_server.cc
void bind_client(pybind11::module_& m);  // bind_client.cc (which also calls bind_codec)
void bind_codec(pybind11::module_& m);   // bind_codec.cc
// "none", "fp16", "int8" -> Encoding; ValueError naming `what` otherwise (bind_codec.cc).
ps::Encoding parse_compression(const std::string& name, const char* what = "compression");
}  // namespace cpu_dist::python
