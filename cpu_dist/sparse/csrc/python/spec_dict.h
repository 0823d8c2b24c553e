// The one reading of a table spec dict (cpu_dist/common/tables.py TableConfig.spec: name, dim,
// optimizer, init_scale, seed, num_embeddings, admit_after, expire_after, eps), for the shard's
// Server(tables=...) (bind_server.cc) and the client's create_tables (bind_client_tables.cc), so
// that both refuse a bad key with the same words.  Header-only: each extension compiles its
// copy (the client's links none of the shard's code).
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>

#include "optimizer.h"
#include "ps.pb.h"

namespace cpu_dist::python {

namespace py = pybind11;

// The spec dict at `list`[index] of a call (`call`: "create_tables: " or "" for the shard) as
// the wire's TableSpec.  name, dim, optimizer and init_scale are required; seed,
// num_embeddings, admit_after and expire_after are 0 where left out, eps 1e-8 for Adagrad (0 for
// the others, given or not); None is as left out.  Refused, naming the table ("table 'x'", or
// the list entry without a string name) and the key: something not a dict (TypeError), an
// unknown key, a missing one, a value of the wrong type or an integer out of its field's range
// (ValueError).  Other limits (names, widths, scales) are the shard's spec_error.
inline ps::TableSpec spec_from_dict(const py::handle& obj, const std::string& call,
                                    const std::string& list, size_t index) {
  const std::string entry = call + list + "[" + std::to_string(index) + "]";
  if (!py::isinstance<py::dict>(obj))
    throw py::type_error(entry + " must be a spec dict, got " +
                         std::string(py::str(py::type::of(obj).attr("__name__"))));
  const py::dict d = py::reinterpret_borrow<py::dict>(obj);
  const auto given = [&](const char* key) { return d.contains(key) && !d[key].is_none(); };
  const bool named = given("name") && py::isinstance<py::str>(d["name"]);
  const std::string who = named ? call + "table '" + py::cast<std::string>(d["name"]) + "'" : entry;
  static const char* const kKeys[] = {"name",        "dim",          "optimizer",
                                      "init_scale",  "seed",         "num_embeddings",
                                      "admit_after", "expire_after", "eps"};
  for (const auto& kv : d) {
    const std::string key = py::cast<std::string>(py::str(kv.first));
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      throw py::value_error(who + ": unknown key '" + key + "'");
  }
  for (const char* required : {"name", "dim", "optimizer", "init_scale"})
    if (!given(required))
      throw py::value_error(who + ": missing key '" + std::string(required) + "'");
  const auto wrong_type = [&](const char* key) {
    return py::value_error(who + ": key '" + key + "' has the wrong type (" +
                           std::string(py::str(py::type::of(d[key]).attr("__name__"))) + ")");
  };
  const auto text = [&](const char* key) {
    if (!py::isinstance<py::str>(d[key])) throw wrong_type(key);
    return py::cast<std::string>(d[key]);
  };
  const auto real = [&](const char* key, double fallback) {
    if (!given(key)) return fallback;
    try {
      return py::cast<double>(d[key]);
    } catch (const py::cast_error&) {
      throw wrong_type(key);
    }
  };
  const auto integer = [&](const char* key, uint64_t lo, uint64_t hi) -> uint64_t {
    if (!given(key)) return 0;
    // An int or what stands for one (numpy's integers: __index__); 4.0 is no width.
    const py::object o = d[key];
    if (!PyIndex_Check(o.ptr())) throw wrong_type(key);
    const auto v = py::reinterpret_steal<py::int_>(PyNumber_Index(o.ptr()));
    if (!v) throw py::error_already_set();
    if (v < py::int_(lo) || v > py::int_(hi))
      throw py::value_error(who + ": " + key + " must be in " + std::to_string(lo) + ".." +
                            std::to_string(hi) + ", got " + std::string(py::str(v)));
    return py::cast<uint64_t>(v);
  };
  ps::TableSpec spec;
  spec.set_name(text("name"));
  spec.set_dim(static_cast<uint32_t>(integer("dim", 1, UINT32_MAX)));
  const std::string opt = text("optimizer");
  const std::optional<ps::OptimizerKind> kind = ps::optimizer_from_name(opt);
  if (!kind)
    throw py::value_error(who + ": optimizer must be 'sgd', 'rowwise_adagrad' or 'adagrad', got '" +
                          opt + "'");
  spec.set_optimizer(static_cast<ps::Optimizer>(static_cast<int>(*kind)));
  spec.set_init_scale(static_cast<float>(real("init_scale", 0.0)));
  spec.set_seed(integer("seed", 0, UINT64_MAX));
  spec.set_num_embeddings(integer("num_embeddings", 0, UINT64_MAX));
  spec.set_admit_after(static_cast<uint32_t>(integer("admit_after", 0, UINT32_MAX)));
  spec.set_expire_after(static_cast<uint32_t>(integer("expire_after", 0, UINT32_MAX)));
  const double eps = real("eps", ps::kDefaultAdagradEps);  // read (and checked) either way
  spec.set_eps(*kind == ps::OptimizerKind::kAdagrad ? static_cast<float>(eps) : 0.0f);
  return spec;
}

}  // namespace cpu_dist::python
