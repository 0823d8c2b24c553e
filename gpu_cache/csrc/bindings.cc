// gpu_cache._metadata: CacheMetadata for the Python controller.  Arrays go in and out as
// compact int64 numpy vectors (positions, slots, keys); the GIL is released around the loops.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "cache_metadata.h"

namespace py = pybind11;
using Int64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

namespace {

Int64Array as_1d(const py::handle& obj, const char* what) {
  Int64Array a = Int64Array::ensure(obj);
  if (!a) throw py::error_already_set();
  if (a.ndim() != 1) throw py::value_error(std::string(what) + " must be a 1-D array");
  return a;
}

py::array_t<int64_t> to_numpy(const std::vector<int64_t>& v) {
  py::array_t<int64_t> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

// Optional per-key scores, checked against the key count.
std::optional<Int64Array> scores_for(const std::optional<py::handle>& scores, py::ssize_t n) {
  if (!scores || scores->is_none()) return std::nullopt;
  Int64Array s = as_1d(*scores, "scores");
  if (s.shape(0) != n) throw py::value_error("scores must have one entry per key");
  return s;
}

// A float32 C-contiguous 2-D numpy array (a torch CPU tensor's .numpy() view) taken by
// reference: converting it would write into a temporary copy, so anything else is an error.
gpu_cache::RowMatrix as_rows(const py::array& a, const char* what, bool writable) {
  if (a.ndim() != 2) throw py::value_error(std::string(what) + " must be a 2-D array");
  if (!a.dtype().is(py::dtype::of<float>()))
    throw py::type_error(std::string(what) + " must be float32");
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(std::string(what) + " must be C-contiguous");
  if (writable && !a.writeable()) throw py::value_error(std::string(what) + " is read-only");
  return {static_cast<float*>(const_cast<void*>(a.data())), static_cast<int64_t>(a.shape(0)),
          static_cast<int64_t>(a.shape(1))};
}

}  // namespace

PYBIND11_MODULE(_metadata, m) {
  m.doc() = "Bounded embedding-cache metadata (slots, eviction order, previous update steps)";
  m.def(
      "copy_rows",
      [](const py::array& src, const py::handle& src_idx, const py::array& dst,
         const py::handle& dst_idx) {
        auto s_rows = as_rows(src, "src", false);
        auto d_rows = as_rows(dst, "dst", true);
        Int64Array si = as_1d(src_idx, "src_idx"), di = as_1d(dst_idx, "dst_idx");
        if (si.shape(0) != di.shape(0))
          throw py::value_error("src_idx and dst_idx must have the same length");
        py::gil_scoped_release release;
        gpu_cache::copy_rows(s_rows, si.data(), d_rows, di.data(),
                             static_cast<size_t>(si.shape(0)));
      },
      py::arg("src"), py::arg("src_idx"), py::arg("dst"), py::arg("dst_idx"),
      "dst[dst_idx[i]] = src[src_idx[i]] for float32 host row matrices (indices checked)");
  using gpu_cache::CacheMetadata;
  py::class_<CacheMetadata>(m, "BagPipeCacheMetadata")
      .def(py::init<int64_t>(), py::arg("capacity_rows"))
      .def_property_readonly("capacity", &CacheMetadata::capacity)
      .def_property_readonly("size", &CacheMetadata::size)
      .def(
          "query",
          [](CacheMetadata& c, const py::handle& keys, std::optional<py::handle> scores) {
            Int64Array k = as_1d(keys, "keys");
            auto s = scores_for(scores, k.shape(0));
            gpu_cache::QueryResult r;
            {
              py::gil_scoped_release release;
              r = c.query(k.data(), static_cast<size_t>(k.shape(0)), s ? s->data() : nullptr);
            }
            return py::make_tuple(to_numpy(r.hit_pos), to_numpy(r.hit_slot));
          },
          py::arg("keys"), py::arg("scores") = py::none(),
          "(hit positions, their slots); hits take the given scores (or an LRU tick)")
      .def(
          "lookup",
          [](const CacheMetadata& c, const py::handle& keys) {
            Int64Array k = as_1d(keys, "keys");
            std::vector<int64_t> out;
            {
              py::gil_scoped_release release;
              out = c.lookup(k.data(), static_cast<size_t>(k.shape(0)));
            }
            return to_numpy(out);
          },
          py::arg("keys"), "slot of each key, -1 when not resident; changes nothing")
      .def(
          "admit",
          [](CacheMetadata& c, const py::handle& keys, std::optional<py::handle> scores,
             int64_t max_admit, bool score_gate) {
            Int64Array k = as_1d(keys, "keys");
            auto s = scores_for(scores, k.shape(0));
            if (max_admit < 0) max_admit = c.capacity();
            gpu_cache::AdmitResult r;
            {
              py::gil_scoped_release release;
              r = c.admit(k.data(), static_cast<size_t>(k.shape(0)), s ? s->data() : nullptr,
                          max_admit, score_gate);
            }
            return py::make_tuple(to_numpy(r.slot), to_numpy(r.src), to_numpy(r.evicted));
          },
          py::arg("keys"), py::arg("scores") = py::none(), py::arg("max_admit") = -1,
          py::arg("score_gate") = false,
          "(unique destination slots, final source position of each, evicted keys)")
      .def(
          "invalidate",
          [](CacheMetadata& c, const py::handle& keys) {
            Int64Array k = as_1d(keys, "keys");
            py::gil_scoped_release release;
            return c.invalidate(k.data(), static_cast<size_t>(k.shape(0)));
          },
          py::arg("keys"), "drop resident keys; returns how many were resident")
      .def(
          "sgd_resident",
          [](const CacheMetadata& c, const py::handle& keys, const py::handle& grads, float lr,
             float divisor, const py::array& rows) {
            Int64Array k = as_1d(keys, "keys");
            using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
            F32 g = F32::ensure(grads);
            if (!g) throw py::error_already_set();
            auto r = as_rows(rows, "rows", true);
            if (g.ndim() != 2 || g.shape(0) != k.shape(0) || g.shape(1) != r.dim)
              throw py::value_error("grads must be len(keys) x the row width");
            if (!(divisor > 0.0f)) throw py::value_error("divisor must be positive");
            py::gil_scoped_release release;
            return c.sgd_resident(k.data(), static_cast<size_t>(k.shape(0)), g.data(), lr, divisor,
                                  r);
          },
          py::arg("keys"), py::arg("grads"), py::arg("lr"), py::arg("divisor"), py::arg("rows"),
          "rows[slot] -= lr * (grad / divisor) for the resident ones of unique keys (the PS's "
          "float32 operation order); returns how many")
      .def("clear", &CacheMetadata::clear)
      .def(
          "resident",
          [](const CacheMetadata& c) {
            auto r = c.resident();
            return py::make_tuple(to_numpy(r.first), to_numpy(r.second));
          },
          "(resident keys, their slots) in slot order")
      .def(
          "record_updates",
          [](CacheMetadata& c, const py::handle& keys, int64_t step) {
            Int64Array k = as_1d(keys, "keys");
            py::gil_scoped_release release;
            c.record_updates(k.data(), static_cast<size_t>(k.shape(0)), step);
          },
          py::arg("keys"), py::arg("step"), "these keys were updated by global step `step`")
      .def(
          "previous_update",
          [](const CacheMetadata& c, const py::handle& keys) {
            Int64Array k = as_1d(keys, "keys");
            std::vector<int64_t> out;
            {
              py::gil_scoped_release release;
              out = c.previous_update(k.data(), static_cast<size_t>(k.shape(0)));
            }
            return to_numpy(out);
          },
          py::arg("keys"), "last recorded update step of each key, -1 if none")
      .def("prune_updates", &CacheMetadata::prune_updates, py::arg("committed"),
           py::call_guard<py::gil_scoped_release>(),
           "forget keys whose last update is a step <= committed (a read of them waits for no "
           "commit); returns how many")
      .def_property_readonly("update_entries", &CacheMetadata::update_entries,
                             "keys the previous-update map holds");
}
