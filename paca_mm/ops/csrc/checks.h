// Argument checks shared by paca_mm's CPU ops.
#pragma once

#include <ATen/ATen.h>

namespace paca_mm_checks {

// `t` (argument `name` of op `op`) must be a contiguous float32 CPU tensor of `shape`.
inline void check_f32(const at::Tensor& t, const char* op, const char* name,
                      at::IntArrayRef shape) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
              "paca_mm ", op, ": ", name, " must be a contiguous float32 CPU tensor");
  TORCH_CHECK(t.sizes() == shape, "paca_mm ", op, ": ", name, " has shape ", t.sizes(),
              ", expected ", shape);
}

}  // namespace paca_mm_checks
