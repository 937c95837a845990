// GEMMs against a right-hand matrix that stays the same for many calls (a layer's weight, an
// image's keys), for paca_mm's CPU ops:  C (m x n) = A (m x k) B (k x n)  (+ C).
//
// The ops run many band-sized GEMMs against the same B. MKL's sgemm re-packs B into its
// internal layout on every call (5-20 % of the time at these shapes); here B is packed once
// per thread (cblas_sgemm_pack) and each band runs cblas_sgemm_compute on it: 4-20 % faster
// per GEMM, same float32 arithmetic. The x86 builds of libtorch export these MKL functions;
// they are declared weak, so the ops still load without them and then (or with
// PACA_MM_PACKED_GEMM=0) the same calls go to ATen's mm.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>

extern "C" {
// MKL's LP64 CBLAS interface (MKL_INT = int; the enums are ints).
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest) __attribute__((weak));
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc) __attribute__((weak));
}

namespace paca_mm_gemm {

enum : int { kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162 };

// Whether B matrices are packed: MKL's functions are there and PACA_MM_PACKED_GEMM != "0".
inline bool packed_gemm_enabled() {
  if (!cblas_sgemm_pack_get_size || !cblas_sgemm_pack || !cblas_sgemm_compute) return false;
  const char* env = std::getenv("PACA_MM_PACKED_GEMM");
  return !(env && env[0] == '0' && env[1] == '\0');
}

// How many matrices this process packed (for tests: which path ran).
inline std::atomic<int64_t>& packed_count() {
  static std::atomic<int64_t> count{0};
  return count;
}

inline bool fits_int(int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

// Whether packing a (k x n) B pays for a thread that multiplies `tokens` rows of A by it in
// all: packing copies B once, and MKL's per-call packing that it saves is only dear for
// large B (small ones take its no-copy kernels). Measured on PaCa's layers (2 threads):
// 1568 tokens per thread and a 147 KB weight 1.05x the unpacked time, 392 tokens 1.14x;
// 2048 tokens 0.98x; 2000 tokens and a 1.6 MB weight 0.91x.
inline bool packing_pays(int64_t k, int64_t n, int64_t tokens) {
  return tokens >= (k * n * static_cast<int64_t>(sizeof(float)) > (1 << 20) ? 1024 : 2048);
}

// A float32 CPU matrix B (k x n) with one unit stride, e.g. w.t() of a contiguous (n, k)
// weight or a row-major (k, n) block of a larger matrix. Pack it inside the parallel region
// of the thread that uses it (MKL then packs and computes with one thread, as it asks).
class ConstB {
 public:
  // m: the row count of A in the usual call (MKL's packing hint).
  ConstB(const at::Tensor& b, int64_t m, bool pack) : b_(b), k_(b.size(0)), n_(b.size(1)) {
    int trans = 0;
    int64_t ld = 0;
    if (b.stride(1) == 1) {
      trans = kNoTrans, ld = b.stride(0);
    } else if (b.stride(0) == 1) {
      trans = kTrans, ld = b.stride(1);
    }
    if (!pack || !trans || k_ == 0 || n_ == 0 || !fits_int(m) || !fits_int(k_) ||
        !fits_int(n_) || !fits_int(ld) || ld < (trans == kNoTrans ? n_ : k_))
      return;
    const int mi = static_cast<int>(std::max<int64_t>(m, 1));
    const size_t bytes = cblas_sgemm_pack_get_size(kBMatrix, mi, n_, k_);
    packed_ = at::empty({static_cast<int64_t>(bytes / sizeof(float)) + 1}, b.options());
    cblas_sgemm_pack(kRowMajor, kBMatrix, trans, mi, n_, k_, 1.0f, b.data_ptr<float>(), ld,
                     packed_.data_ptr<float>());
    packed_count().fetch_add(1, std::memory_order_relaxed);
  }

  // C (m x n, row stride ldc) = A (m x k, row stride lda) B, plus C if accumulate.
  void mm(const float* a, int64_t m, int64_t lda, float* c, int64_t ldc, bool accumulate) const {
    if (m == 0) return;
    if (packed_.defined() && fits_int(m) && fits_int(lda) && fits_int(ldc)) {
      cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n_, k_, a, lda,
                          packed_.data_ptr<float>(), n_, accumulate ? 1.0f : 0.0f, c, ldc);
      return;
    }
    const auto opts = b_.options();
    const at::Tensor A = at::from_blob(const_cast<float*>(a), {m, k_}, {lda, 1}, opts);
    at::Tensor C = at::from_blob(c, {m, n_}, {ldc, 1}, opts);
    if (accumulate) {
      C.addmm_(A, b_);
    } else {
      at::mm_out(C, A, b_);
    }
  }

 private:
  at::Tensor b_, packed_;
  int64_t k_, n_;
};

// c (m x n, row stride ldc) += bias (n) [+ r (m x n, row stride ldr) when r is given].
inline void add_rows(float* c, int64_t m, int64_t n, int64_t ldc, const float* bias,
                     const float* r = nullptr, int64_t ldr = 0) {
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    const float* ri = r ? r + i * ldr : nullptr;
    if (ri && bias) {
      for (int64_t j = 0; j < n; ++j) ci[j] += ri[j] + bias[j];
    } else if (ri) {
      for (int64_t j = 0; j < n; ++j) ci[j] += ri[j];
    } else if (bias) {
      for (int64_t j = 0; j < n; ++j) ci[j] += bias[j];
    }
  }
}

}  // namespace paca_mm_gemm
