// Each extension registers its own classes: bind_server on cpu_dist.sparse._ps (module.cc),
// bind_client (with bind_codec and bind_reads) on cpu_dist.sparse._ps_client (module_client.cc).
#pragma once
#include <pybind11/pybind11.h>

#include <string>

#include "codec.h"

namespace cpu_dist::python {
void bind_server(pybind11::module_& m);  // bind_server.cc
void bind_client(pybind11::module_& m);  // bind_client.cc (which also calls bind_codec)
void bind_codec(pybind11::module_& m);   // bind_codec.cc
void bind_reads(pybind11::module_& m);   // bind_reads.cc (mark_written, interleave_rows)
// "none", "fp16", "int8" -> Encoding; ValueError naming `what` otherwise (bind_codec.cc).
ps::Encoding parse_compression(const std::string& name, const char* what = "compression");
}  // namespace cpu_dist::python
