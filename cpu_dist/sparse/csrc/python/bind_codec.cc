// cpu_dist.sparse._ps_client.encode_rows / decode_rows: the row encodings of codec.h as Python sees
// them, for the tests (a numpy twin is held equal to them bit for bit) and for a reference
// that models what a compressed job's rows and gradients become.
#include <cstdint>
#include <string>

#include "bindings.h"
#include "codec.h"
#include "convert.h"

namespace cpu_dist::python {

ps::Encoding parse_compression(const std::string& name, const char* what) {
  auto e = ps::encoding_from_name(name);
  if (!e)
    throw py::value_error(std::string(what) + " must be 'none', 'fp16' or 'int8', got '" + name +
                          "'");
  return *e;
}

namespace {

using BytesArray = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

py::array_t<uint8_t> encode(const py::handle& rows, const std::string& compression) {
  const ps::Encoding e = parse_compression(compression);
  RowsArray a = RowsArray::ensure(rows);
  if (!a) throw py::error_already_set();
  if (a.ndim() != 2 || a.shape(1) < 1)
    throw py::value_error("rows must be a 2-D array with at least one column, got shape " +
                          shape_str(a));
  const size_t n = static_cast<size_t>(a.shape(0));
  const uint32_t dim = static_cast<uint32_t>(a.shape(1));
  const size_t row_bytes = ps::encoded_row_bytes(e, dim);
  py::array_t<uint8_t> out({a.shape(0), static_cast<py::ssize_t>(row_bytes)});
  size_t bad = 0;
  ps::CodecError err;
  bool ok;
  {
    uint8_t* dst = out.mutable_data();
    py::gil_scoped_release release;
    ok = ps::encode_rows(e, a.data(), n, dim, dst, &bad, &err);
  }
  if (!ok)
    throw py::value_error("row " + std::to_string(bad) + " cannot be encoded as " + compression +
                          ": " + ps::describe(e, err));
  return out;
}

py::array_t<float> decode(const py::handle& data, uint32_t dim, const std::string& compression) {
  const ps::Encoding e = parse_compression(compression);
  if (dim == 0) throw py::value_error("dim must be >= 1");
  BytesArray a = BytesArray::ensure(data);
  if (!a) throw py::error_already_set();
  const size_t row_bytes = ps::encoded_row_bytes(e, dim);
  if (a.ndim() != 2 || a.shape(1) != static_cast<py::ssize_t>(row_bytes))
    throw py::value_error("data must be uint8 of shape (n, " + std::to_string(row_bytes) +
                          ") for dim " + std::to_string(dim) + " as " + compression +
                          ", got shape " + shape_str(a));
  py::array_t<float> out({a.shape(0), static_cast<py::ssize_t>(dim)});
  size_t bad = 0;
  ps::CodecError err;
  bool ok;
  {
    float* dst = out.mutable_data();
    py::gil_scoped_release release;
    ok = ps::decode_rows(e, a.data(), static_cast<size_t>(a.shape(0)), dim, dst, &bad, &err);
  }
  if (!ok)
    throw py::value_error("row " + std::to_string(bad) + " is no valid " + compression +
                          " row: " + ps::describe(e, err));
  return out;
}

}  // namespace

void bind_codec(py::module_& m) {
  m.def("encode_rows", &encode, py::arg("rows"), py::arg("compression"),
        "rows (float32 [n, dim]) as the wire carries them with `compression` ('none', 'fp16', "
        "'int8'): uint8 [n, bytes per row] (see proto/ps.proto, Compression).  ValueError "
        "naming the row and column of a value the encoding cannot carry.");
  m.def("decode_rows", &decode, py::arg("data"), py::arg("dim"), py::arg("compression"),
        "The float32 rows [n, dim] that encoded rows (uint8 [n, bytes per row]) stand for: "
        "what a shard applies for a compressed gradient, and what a compressed pull returns.");
}

}  // namespace cpu_dist::python
