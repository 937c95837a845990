// The ConvFFN of a PaCa block for float32 CPU inference, in one op:
//
//   out (+)= fc2(GELU(DWConv3x3(h) + h)) with h = fc1(LN(x)),  x, out: (B, H*W, C)
//
// The image is split into one chunk of rows per thread; each thread runs its chunk a few rows
// at a time (LN, fc1 GEMM, depth-wise 3x3 + exact GELU, fc2 GEMM into `out`), so a band's
// hidden map (rows x W x rC) stays in that core's L2 cache instead of streaming through L3
// between ops. The GEMMs run single-threaded inside the parallel region, against weights
// each thread packed once (gemm.h); the depth-wise conv + GELU is the vectorised loop below.
// fc1's bias is folded into it (the zero padding of the conv then reads -b1, which is what
// padding the biased map with zeros means), so fc1 is a plain GEMM.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include "checks.h"
#include "gemm.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using namespace paca_mm_vec;

// Exact (erf) GELU, a Phi(a) = a (1 + erf(a / sqrt(2))) / 2. erf(x) = x P(x^2) / Q(x^2) on
// |x| < 3.9 (+-1 beyond, where float32's erf is +-1 too), P and Q of degree 5 fitted by
// tools/fit_gelu_erf.py: |error| < 2.2e-8 in exact arithmetic, about 2 ulp of the GELU in
// float32. Half the time of the erfc-times-exp form (Abramowitz & Stegun 7.1.26, what ATen
// uses): no exp and no sign handling, 10 FMAs and one division.
PACA_INLINE v16f gelu(v16f a) {
  v16f x = a * 0.70710678118654752f;
  x = x < -3.9f ? vset(-3.9f) : x;
  x = x > 3.9f ? vset(3.9f) : x;
  const v16f t = x * x;
  v16f p = vset(1.974894933e-06f);
  p = p * t + 2.880337760e-04f;
  p = p * t + 4.003296502e-03f;
  p = p * t + 5.346640319e-02f;
  p = p * t + 1.962407765e-01f;
  p = p * t + 1.128378977e+00f;
  v16f q = vset(3.748113750e-05f);
  q = q * t + 1.216275567e-03f;
  q = q * t + 1.544372331e-02f;
  q = q * t + 1.164730434e-01f;
  q = q * t + 5.072450219e-01f;
  q = q * t + 1.0f;
  v16f e = x * p / q;
  e = x <= -3.9f ? vset(-1.0f) : e;
  e = x >= 3.9f ? vset(1.0f) : e;
  const v16f h = 0.5f * a;
  return h + h * e;
}

// One output row of GELU(DWConv3x3 + bias): rows t, m, b (W x C, nullptr = padding row) are
// the input rows above, at and below it. Padding pixels read `pad`. C % 16 == 0.
PACA_ISA_CLONES void dw_gelu_row(const float* t, const float* m, const float* b, int64_t W,
                                  int64_t C, const float* w9, const float* bias,
                                  const float* pad, float* out) {
  for (int64_t c0 = 0; c0 < C; c0 += 16) {
    const v16f k0 = vload(w9 + c0), k1 = vload(w9 + C + c0), k2 = vload(w9 + 2 * C + c0);
    const v16f k3 = vload(w9 + 3 * C + c0), k4 = vload(w9 + 4 * C + c0),
               k5 = vload(w9 + 5 * C + c0);
    const v16f k6 = vload(w9 + 6 * C + c0), k7 = vload(w9 + 7 * C + c0),
               k8 = vload(w9 + 8 * C + c0);
    const v16f bv = vload(bias + c0), pv = vload(pad + c0);
    // the window's left (l), middle (m) and right (r) columns, top/mid/bottom rows
    v16f lt = pv, lm = pv, lb = pv;
    v16f mt = t ? vload(t + c0) : pv, mm = m ? vload(m + c0) : pv, mb = b ? vload(b + c0) : pv;
    for (int64_t w = 0; w < W; ++w) {
      v16f rt = pv, rm = pv, rb = pv;
      if (w + 1 < W) {
        const int64_t o = (w + 1) * C + c0;
        if (t) rt = vload(t + o);
        if (m) rm = vload(m + o);
        if (b) rb = vload(b + o);
      }
      const v16f a0 = bv + k0 * lt + k1 * mt + k2 * rt;
      const v16f a1 = k3 * lm + k4 * mm + k5 * rm;
      const v16f a2 = k6 * lb + k7 * mb + k8 * rb;
      vstore(out + w * C + c0, gelu(a0 + (a1 + a2)));
      lt = mt, lm = mm, lb = mb;
      mt = rt, mm = rm, mb = rb;
    }
  }
}

// LayerNorm of `rows` rows of C floats (C % 16 == 0): out = (x - mean) / sqrt(var + eps) * w + b.
PACA_ISA_CLONES void layer_norm_rows(const float* x, int64_t rows, int64_t C, const float* w,
                                      const float* b, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r, x += C, out += C) {
    v16f s = vset(0.0f);
    for (int64_t c = 0; c < C; c += 16) s += vload(x + c);
    const float mean = hsum(s) / static_cast<float>(C);
    v16f q = vset(0.0f);
    for (int64_t c = 0; c < C; c += 16) {
      const v16f d = vload(x + c) - mean;
      q += d * d;
    }
    const float rstd = 1.0f / std::sqrt(hsum(q) / static_cast<float>(C) + eps);
    for (int64_t c = 0; c < C; c += 16)
      vstore(out + c, (vload(x + c) - mean) * rstd * vload(w + c) + vload(b + c));
  }
}

void check(const at::Tensor& t, const char* name, at::IntArrayRef shape) {
  paca_mm_checks::check_f32(t, "conv_ffn", name, shape);
}

}  // namespace

// x, out: (B, H*W, C); out may be x itself. accumulate: out += FFN(x), else out = FFN(x).
// w1 (rC, C), b1 (rC), w9 (9, rC) = the 3x3 taps (row-major, the shortcut's +1 included),
// dw_bias (rC), w2 (C, rC), b2 (C); ln_weight/ln_bias (C) or undefined for no pre-norm.
// band_rows: image rows a thread computes at a time.
void conv_ffn_inference(const at::Tensor& x, int64_t H, int64_t W,
                        const std::optional<at::Tensor>& ln_weight,
                        const std::optional<at::Tensor>& ln_bias, double eps,
                        const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w9,
                        const at::Tensor& dw_bias, const at::Tensor& w2, const at::Tensor& b2,
                        at::Tensor& out, bool accumulate, int64_t band_rows) {
  TORCH_CHECK(x.dim() == 3, "paca_mm conv_ffn: x must be (B, H*W, C)");
  const int64_t B = x.size(0), C = x.size(2), hid = w1.size(0);
  TORCH_CHECK(x.size(1) == H * W, "paca_mm conv_ffn: x has ", x.size(1), " tokens, not H*W = ",
              H * W);
  TORCH_CHECK(hid % 16 == 0, "paca_mm conv_ffn: the hidden width must be a multiple of 16");
  TORCH_CHECK(band_rows >= 1, "paca_mm conv_ffn: band_rows must be >= 1");
  check(x, "x", {B, H * W, C});
  check(out, "out", {B, H * W, C});
  check(w1, "w1", {hid, C});
  check(b1, "b1", {hid});
  check(w9, "w9", {9, hid});
  check(dw_bias, "dw_bias", {hid});
  check(w2, "w2", {C, hid});
  check(b2, "b2", {C});
  const bool has_ln = ln_weight.has_value() && ln_weight->defined();
  if (has_ln) {
    check(*ln_weight, "ln_weight", {C});
    TORCH_CHECK(ln_bias.has_value() && ln_bias->defined(), "paca_mm conv_ffn: ln_bias missing");
    check(*ln_bias, "ln_bias", {C});
  }
  c10::NoGradGuard no_grad;

  // fc1's bias b1 is folded into the conv: the GEMM leaves it out, the conv's bias gains
  // b1 * sum(taps), and padding pixels read -b1 (so that they count as 0 = -b1 + b1).
  std::vector<float> bias_full(hid), pad(hid);
  {
    const float *pw = w9.data_ptr<float>(), *pb = dw_bias.data_ptr<float>(),
                *pb1 = b1.data_ptr<float>();
    for (int64_t c = 0; c < hid; ++c) {
      float s = 0;
      for (int k = 0; k < 9; ++k) s += pw[k * hid + c];
      bias_full[c] = pb[c] + pb1[c] * s;
      pad[c] = -pb1[c];
    }
  }
  const at::Tensor w1t = w1.t(), w2t = w2.t();
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), H));
  // chunk k of every image: rows [bounds[k], bounds[k + 1])
  std::vector<int64_t> bounds(threads + 1);
  for (int64_t k = 0; k <= threads; ++k) bounds[k] = H * k / threads;

  // dst (n*W, hid) = LN(xs) @ w1^T (no bias), xs: (n*W, C), w1p: w1^T (packed or not)
  auto hidden_rows = [&](const at::Tensor& xs, at::Tensor dst, const paca_mm_gemm::ConstB& w1p) {
    at::Tensor a = xs;
    if (has_ln) {
      if (C % 16 == 0) {
        a = at::empty_like(xs);
        layer_norm_rows(xs.data_ptr<float>(), xs.size(0), C, ln_weight->data_ptr<float>(),
                        ln_bias->data_ptr<float>(), static_cast<float>(eps), a.data_ptr<float>());
      } else {
        a = at::layer_norm(xs, {C}, *ln_weight, *ln_bias, eps);
      }
    }
    w1p.mm(a.data_ptr<float>(), a.size(0), C, dst.data_ptr<float>(), hid, false);
  };

  // The hidden rows at chunk borders (rows s - 1 and s for each chunk start s > 0), computed
  // before any thread writes `out` (which may be x): a thread never reads x rows of another.
  at::Tensor border = at::empty({B, threads, 2, W, hid}, x.options());
  const paca_mm_gemm::ConstB w1_unpacked(w1t, 2 * W, false);  // a few rows: not worth packing
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t k = 1; k < threads; ++k) {
      const int64_t s = bounds[k];
      hidden_rows(x[bi].narrow(0, (s - 1) * W, 2 * W), border[bi][k].view({2 * W, hid}),
                  w1_unpacked);
    }

  const int64_t tokens = B * H * W / threads;  // per thread
  const bool pack = paca_mm_gemm::packed_gemm_enabled() &&
                    paca_mm_gemm::packing_pays(C, hid, tokens);
  const at::ThreadLocalState tls;  // grad / inference mode of the caller, for the workers
  at::parallel_for(0, B * threads, 1, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard tls_guard(tls);
    c10::NoGradGuard guard;
    const int64_t rb = std::min(band_rows, H);
    const paca_mm_gemm::ConstB w1p(w1t, rb * W, pack), w2p(w2t, rb * W, pack);
    // A ring of S hidden rows: hidden row j (j >= -1) lives in slot (j + 1) % S. A band's
    // output rows r0 .. r1 - 1 need hidden rows r0 - 1 .. r1, at most S = rb + 2 of them,
    // so a band only computes the rows it adds and nothing is moved between bands.
    const int64_t S = rb + 2;
    at::Tensor buf = at::empty({S, W, hid}, x.options());
    at::Tensor y = at::empty({rb * W, hid}, x.options());
    float* bp = buf.data_ptr<float>();
    const int64_t hrow = W * hid;
    auto slot = [&](int64_t row) { return (row + 1) % S; };
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / threads, k = task % threads;
      const int64_t R0 = bounds[k], R1 = bounds[k + 1];
      if (R0 >= R1) continue;
      const at::Tensor xb = x[bi], ob = out[bi];
      if (R0 > 0) buf[slot(R0 - 1)].copy_(border[bi][k][0]);  // else row -1 is padding
      int64_t next = R0;  // the next hidden row of this chunk to compute
      for (int64_t r0 = R0; r0 < R1; r0 += rb) {
        const int64_t r1 = std::min(r0 + rb, R1);
        const int64_t last = std::min(r1, H - 1);  // the band's last hidden row
        const int64_t own_last = std::min(last, R1 - 1);  // ... that this chunk computes
        while (next <= own_last) {  // rows next .. own_last, split where the ring wraps
          const int64_t s0 = slot(next), n = std::min(own_last + 1 - next, S - s0);
          hidden_rows(xb.narrow(0, next * W, n * W), buf.narrow(0, s0, n).view({-1, hid}),
                      w1p);
          next += n;
        }
        if (last == R1) buf[slot(R1)].copy_(border[bi][k + 1][1]);  // the next chunk's row
        // output rows r0 .. r1 - 1
        float* yp = y.data_ptr<float>();
        for (int64_t r = r0; r < r1; ++r) {
          const float* tp = (r == 0) ? nullptr : bp + slot(r - 1) * hrow;
          const float* btm = (r + 1 >= H) ? nullptr : bp + slot(r + 1) * hrow;
          dw_gelu_row(tp, bp + slot(r) * hrow, btm, W, hid, w9.data_ptr<float>(),
                      bias_full.data(), pad.data(), yp + (r - r0) * hrow);
        }
        float* o = ob.data_ptr<float>() + r0 * W * C;
        w2p.mm(yp, (r1 - r0) * W, hid, o, C, accumulate);
        paca_mm_gemm::add_rows(o, (r1 - r0) * W, C, C, b2.data_ptr<float>());
      }
    }
  });
}

TORCH_LIBRARY(paca_mm, m) {
  m.def(
      "conv_ffn_inference(Tensor x, int H, int W, Tensor? ln_weight, Tensor? ln_bias, "
      "float eps, Tensor w1, Tensor b1, Tensor w9, Tensor dw_bias, Tensor w2, Tensor b2, "
      "Tensor(a!) out, bool accumulate, int band_rows) -> ()");
  // whether the ops' GEMMs may use packed weights now, and how many matrices were packed
  m.def("packed_gemm_enabled() -> bool", [] { return paca_mm_gemm::packed_gemm_enabled(); });
  m.def("packed_gemm_count() -> int",
        [] { return paca_mm_gemm::packed_count().load(std::memory_order_relaxed); });
}

TORCH_LIBRARY_IMPL(paca_mm, CPU, m) { m.impl("conv_ffn_inference", conv_ffn_inference); }
