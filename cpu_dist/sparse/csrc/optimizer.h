// The row optimizers of the parameter server: the single source of truth for how a row
// changes.  Both push and commit call these, so a reference model needs to copy only this.
//
//   SGD              : w_c -= lr * g_c
//   row-wise Adagrad : s   += (sum_c g_c * g_c) / dim      (float32, columns in order)
//                      step = lr / (sqrtf(s) + 1e-8f)
//                      w_c -= step * g_c
//   Adagrad          : s_c += g_c * g_c                          (a state of dim floats)
//                      w_c -= lr * g_c / (sqrtf(s_c) + eps)      (eps: the table's, 1e-8)
// Built with -ffp-contract=off so that no fused multiply-add changes the bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cpu_dist::ps {

// The values equal the wire's Optimizer enum (proto/ps.proto).
enum class OptimizerKind : int { kSgd = 0, kRowwiseAdagrad = 1, kAdagrad = 2 };

// Adagrad's default eps (a table's spec may name another).
inline constexpr float kDefaultAdagradEps = 1e-8f;

inline std::optional<OptimizerKind> optimizer_from_name(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "rowwise_adagrad") return OptimizerKind::kRowwiseAdagrad;
  if (name == "adagrad") return OptimizerKind::kAdagrad;
  return std::nullopt;
}

inline const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kRowwiseAdagrad: return "rowwise_adagrad";
    case OptimizerKind::kAdagrad: return "adagrad";
  }
  return "unknown";
}

// Floats of optimizer state a row of `dim` keeps: Adagrad's accumulator has one per column;
// row-wise Adagrad's one; SGD keeps the one float of the row-wise layout (always 0), as before
// Adagrad existed, so that its checkpoints and tiers are unchanged.
inline uint32_t state_floats(OptimizerKind k, uint32_t dim) {
  return k == OptimizerKind::kAdagrad ? dim : 1;
}

// Apply one (already aggregated) gradient row to one weight row and its state (state_floats
// of them).  eps is Adagrad's only (row-wise Adagrad's is the constant 1e-8f above).
inline void apply_row(OptimizerKind kind, float lr, const float* g, float* w, float* state,
                      uint32_t dim, float eps = kDefaultAdagradEps) {
  if (kind == OptimizerKind::kSgd) {
    for (uint32_t c = 0; c < dim; ++c) w[c] -= lr * g[c];
    return;
  }
  if (kind == OptimizerKind::kAdagrad) {
    for (uint32_t c = 0; c < dim; ++c) {
      state[c] += g[c] * g[c];
      w[c] -= lr * g[c] / (std::sqrt(state[c]) + eps);
    }
    return;
  }
  float sq = 0.0f;
  for (uint32_t c = 0; c < dim; ++c) sq += g[c] * g[c];
  *state += sq / static_cast<float>(dim);
  const float step = lr / (std::sqrt(*state) + 1e-8f);
  for (uint32_t c = 0; c < dim; ++c) w[c] -= step * g[c];
}

}  // namespace cpu_dist::ps
