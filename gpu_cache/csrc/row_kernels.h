// Row kernels for a cache whose rows live in host memory.  storage.py does the same work with
// torch ops on any device (that is the CUDA path); on the CPU these loops do it in one pass
// without temporaries.  Tests check that both give the same bits on the CPU device.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpu_cache {

// A float32 matrix of `rows` x `dim`, row-major, not owned.
struct RowMatrix {
  float* data;
  int64_t rows;
  int64_t dim;
};

// dst[dst_idx[i]] = src[src_idx[i]] for i < n.  Indices are checked against both matrices
// before anything is written; throws std::out_of_range naming the first bad index.
void copy_rows(const RowMatrix& src, const int64_t* src_idx, const RowMatrix& dst,
               const int64_t* dst_idx, size_t n);

// rows[slot] = rows[slot] - lr * (grad / divisor), element by element in float32: the
// operation order of the PS (it divides the summed gradient by W, then applies w -= lr * g),
// so a cached row stays bit-equal to its PS row.  Built with -ffp-contract=off.
void sgd_row(float* row, const float* grad, int64_t dim, float lr, float divisor);

}  // namespace gpu_cache
