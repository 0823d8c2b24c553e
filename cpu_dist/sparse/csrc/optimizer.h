// The row optimizers of the parameter server: the single source of truth for how a row
// changes.  Both push and commit call these, so a reference model needs to copy only this.
//
//   SGD              : w_c -= lr * g_c
//   row-wise Adagrad : s   += (sum_c g_c * g_c) / dim      (float32, columns in order)
//                      step = lr / (sqrtf(s) + 1e-8f)
//                      w_c -= step * g_c
// Built with -ffp-contract=off so that no fused multiply-add changes the bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cpu_dist::ps {

enum class OptimizerKind : int { kSgd = 0, kRowwiseAdagrad = 1 };

inline std::optional<OptimizerKind> optimizer_from_name(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "rowwise_adagrad") return OptimizerKind::kRowwiseAdagrad;
  return std::nullopt;
}

inline const char* optimizer_name(OptimizerKind k) {
  return k == OptimizerKind::kSgd ? "sgd" : "rowwise_adagrad";
}

// Apply one (already aggregated) gradient row to one weight row and its accumulator.
inline void apply_row(OptimizerKind kind, float lr, const float* g, float* w, float* state,
                      uint32_t dim) {
  if (kind == OptimizerKind::kSgd) {
    for (uint32_t c = 0; c < dim; ++c) w[c] -= lr * g[c];
    return;
  }
  float sq = 0.0f;
  for (uint32_t c = 0; c < dim; ++c) sq += g[c] * g[c];
  *state += sq / static_cast<float>(dim);
  const float step = lr / (std::sqrt(*state) + 1e-8f);
  for (uint32_t c = 0; c < dim; ++c) w[c] -= step * g[c];
}

}  // namespace cpu_dist::ps
