#include "row_kernels.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace gpu_cache {
namespace {

void check_indices(const int64_t* idx, size_t n, int64_t limit, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= limit)
      throw std::out_of_range(std::string(what) + " index " + std::to_string(idx[i]) +
                              " at position " + std::to_string(i) + " is outside [0, " +
                              std::to_string(limit) + ")");
  }
}

}  // namespace

void copy_rows(const RowMatrix& src, const int64_t* src_idx, const RowMatrix& dst,
               const int64_t* dst_idx, size_t n) {
  if (src.dim != dst.dim)
    throw std::invalid_argument("row width differs: " + std::to_string(src.dim) + " vs " +
                                std::to_string(dst.dim));
  check_indices(src_idx, n, src.rows, "source");
  check_indices(dst_idx, n, dst.rows, "destination");
  const size_t bytes = static_cast<size_t>(src.dim) * sizeof(float);
  for (size_t i = 0; i < n; ++i)
    std::memcpy(dst.data + dst_idx[i] * dst.dim, src.data + src_idx[i] * src.dim, bytes);
}

void sgd_row(float* row, const float* grad, int64_t dim, float lr, float divisor) {
  for (int64_t c = 0; c < dim; ++c) {
    const float g = grad[c] / divisor;
    const float step = lr * g;
    row[c] = row[c] - step;
  }
}

}  // namespace gpu_cache
