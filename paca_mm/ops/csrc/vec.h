// Vector helpers shared by paca_mm's CPU ops: 16-float GCC vector type, loads/stores, and
// exp for non-positive arguments. Functions using them are compiled per ISA with
// PACA_ISA_CLONES (AVX-512, AVX2 + FMA, baseline x86-64; the loader picks the best).
#pragma once

#include <cstdint>
#include <cstring>

namespace paca_mm_vec {

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
#define PACA_INLINE inline __attribute__((always_inline))
#define PACA_ISA_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

PACA_INLINE v16f vload(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
PACA_INLINE void vstore(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }
PACA_INLINE v16f vset(float x) { return v16f{} + x; }

// exp(x) for x in [-87, 0]: 2^n p(r), |relative error| < 2e-7 (Cephes' expf polynomial).
PACA_INLINE v16f exp_nonpositive(v16f x) {
  x = x < -87.0f ? vset(-87.0f) : x;
  const v16f n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  v16f r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  v16f p = vset(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
  v16f s;
  std::memcpy(&s, &e, sizeof(s));
  return p * s;
}

// Horizontal max / sum of the 16 lanes (log-step shuffles).
PACA_INLINE v16f swap_halves(v16f v, int step) {
  switch (step) {
    case 8: return __builtin_shuffle(v, v16i{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    case 4: return __builtin_shuffle(v, v16i{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    case 2: return __builtin_shuffle(v, v16i{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    default: return __builtin_shuffle(v, v16i{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  }
}
PACA_INLINE float hmax(v16f v) {
  for (int step = 8; step >= 1; step /= 2) {
    const v16f w = swap_halves(v, step);
    v = v > w ? v : w;
  }
  return v[0];
}
PACA_INLINE float hsum(v16f v) {
  for (int step = 8; step >= 1; step /= 2) v += swap_halves(v, step);
  return v[0];
}

}  // namespace paca_mm_vec
