#include "row_update.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace cpu_dist::ps {

void apply_summed_rows(OptimizerKind kind, float lr, float divisor, const float* sums, float* rows,
                       float* states, size_t n, uint32_t dim, float eps) {
  if (kind != OptimizerKind::kSgd && states == nullptr && n > 0)
    throw std::invalid_argument(std::string("apply_summed_rows: ") + optimizer_name(kind) +
                                " needs the rows' states");
  const size_t sw = kind == OptimizerKind::kSgd ? 0 : state_floats(kind, dim);
  std::vector<float> g(dim);
  float unused = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float* s = sums + i * dim;
    for (uint32_t c = 0; c < dim; ++c) g[c] = s[c] / divisor;
    apply_row(kind, lr, g.data(), rows + i * dim, states != nullptr ? states + i * sw : &unused,
              dim, eps);
  }
}

}  // namespace cpu_dist::ps
