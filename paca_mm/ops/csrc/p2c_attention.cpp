// Multi-head attention of N tokens to a few keys (PaCa's M cluster tokens, or the tokens of a
// small stage), projections included, for float32 CPU inference:
//
//   out (+)= proj(concat_h softmax(q_h k_h^T) v_h) with q = xn Wq^T + bq,  xn, out: (B, N, C)
//
// The keys come pre-scaled and transposed per head, kt: (B, h, d, M); the values v: (B, M, C).
// Every thread takes a contiguous chunk of the tokens and runs it `band` tokens at a time: the
// q GEMM, per head the (band x d) @ (d x M) score GEMM, an in-cache softmax over M and the
// (band x M) @ (M x d) value GEMM into the band's head columns, then the output projection
// into `out`. The band's q, scores and head outputs stay in that core's L2 cache, and every
// GEMM has `band` rows; ATen's flash attention instead works on (32 x d) query blocks and
// reaches a third of the GEMM rate at these shapes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "checks.h"
#include "gemm.h"
#include "vec.h"

namespace {

using namespace paca_mm_vec;

// Softmax over each of `segs` consecutive segments of M scores in each of `rows` rows (rows
// `ld` floats apart), in place, of the scores plus `bias` (segs * M floats, the same for
// every row).
PACA_ISA_CLONES void softmax_segments(float* s, int64_t rows, int64_t ld, int64_t segs,
                                      int64_t M, const float* bias) {
  const int64_t full = M / 16 * 16, tail = M - full;
  // lanes of the last, overlapping window [M - 16, M) that lie beyond the full vectors
  v16f tail_mask = vset(0.0f);
  for (int64_t i = 16 - tail; i < 16; ++i) tail_mask[i] = 1.0f;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < segs; ++g) {
      float* p = s + r * ld + g * M;
      const float* q = bias + g * M;
      if (M < 16) {  // a few keys: scalar
        float m = p[0] + q[0], total = 0;
        for (int64_t c = 1; c < M; ++c) m = p[c] + q[c] > m ? p[c] + q[c] : m;
        for (int64_t c = 0; c < M; ++c) total += (p[c] = std::exp(p[c] + q[c] - m));
        for (int64_t c = 0; c < M; ++c) p[c] /= total;
        continue;
      }
      // the last window, read before the full vectors are overwritten
      const v16f last = vload(p + M - 16) + vload(q + M - 16);
      v16f mx = last;
      for (int64_t c = 0; c < full; c += 16) {
        const v16f v = vload(p + c) + vload(q + c);
        mx = v > mx ? v : mx;
      }
      const float m = hmax(mx);
      v16f sum = vset(0.0f);
      for (int64_t c = 0; c < full; c += 16) {
        const v16f x = vload(p + c) + vload(q + c) - m;
        const v16f e = x < -87.0f ? vset(0.0f) : exp_nonpositive(x);  // 0 below float range
        sum += e;
        vstore(p + c, e);
      }
      v16f e_last = vset(0.0f);
      if (tail) {
        const v16f x = last - m;
        e_last = x < -87.0f ? vset(0.0f) : exp_nonpositive(x);
        sum += e_last * tail_mask;
      }
      const v16f inv = vset(1.0f / hsum(sum));
      for (int64_t c = 0; c < full; c += 16) vstore(p + c, vload(p + c) * inv);
      if (tail) vstore(p + M - 16, e_last * inv);  // the overlap gets the same values again
    }
  }
}

void check(const at::Tensor& t, const char* name, at::IntArrayRef shape) {
  paca_mm_checks::check_f32(t, "p2c_attention", name, shape);
}

}  // namespace

// Two modes (B: batch, N tokens, C channels, h heads of d = C / h channels, M keys):
//
// * per head (kt given): q = xn w_in^T, without q's bias (w_in: (1, C, C)); per head,
//   o_h = softmax(q_h kt_h + b_in[b, h]) v_h with kt (B, h, d, M) the scaled keys transposed,
//   b_in (B, h*M) = q's bias times them, and v (B, M, C) the values;
//   out = o w_out^T + b_out (w_out: (1, C, C)).
// * folded (kt undefined): the q and output projections are folded into the keys and values
//   of each image, w_in (B, h*M, C), w_out (B, C, h*M): the scores are xn w_in[b]^T, their
//   softmax over each head's M (plus b_in[b]) is taken in place, and out = x1 w_out[b]^T
//   (+ b_out). Two GEMMs per band instead of 2 + 2h; worth it when h * M is about C + M
//   (PaCa's first stage).
//
// xn, out, residual: (B, N, C) contiguous float32; out = residual + attention (residual
// undefined: out = attention); out may be xn or residual itself. b_out (C) may be undefined
// (no output bias). band: tokens a thread runs at a time.
void p2c_attention_inference(const at::Tensor& xn, const at::Tensor& w_in,
                             const at::Tensor& b_in, const std::optional<at::Tensor>& kt_opt,
                             const std::optional<at::Tensor>& v_opt, const at::Tensor& w_out,
                             const std::optional<at::Tensor>& b_out_opt,
                             const std::optional<at::Tensor>& residual,
                             at::Tensor& out, int64_t heads, int64_t band) {
  TORCH_CHECK(xn.dim() == 3, "paca_mm p2c_attention: xn must be (B, N, C)");
  TORCH_CHECK(band >= 1, "paca_mm p2c_attention: band must be >= 1");
  TORCH_CHECK(heads >= 1, "paca_mm p2c_attention: heads must be >= 1");
  const int64_t B = xn.size(0), N = xn.size(1), C = xn.size(2);
  TORCH_CHECK(C % heads == 0, "paca_mm p2c_attention: heads = ", heads, " does not divide C = ",
              C);
  const int64_t d = C / heads;
  const bool per_head = kt_opt.has_value() && kt_opt->defined();
  const int64_t M = per_head ? kt_opt->size(-1) : w_in.size(1) / heads;
  TORCH_CHECK(M >= 1, "paca_mm p2c_attention: there must be at least one key");
  const int64_t bw = per_head ? 1 : B, f1 = per_head ? C : heads * M;
  check(xn, "xn", {B, N, C});
  check(out, "out", {B, N, C});
  const bool has_residual = residual.has_value() && residual->defined();
  if (has_residual) check(*residual, "residual", {B, N, C});
  check(w_in, "w_in", {bw, f1, C});
  check(b_in, "b_in", {B, heads * M});
  check(w_out, "w_out", {bw, C, f1});
  const bool has_b_out = b_out_opt.has_value() && b_out_opt->defined();
  if (has_b_out) check(*b_out_opt, "b_out", {C});
  if (per_head) {
    check(*kt_opt, "kt", {B, heads, d, M});
    TORCH_CHECK(v_opt.has_value() && v_opt->defined(), "paca_mm p2c_attention: v missing");
    check(*v_opt, "v", {B, M, C});
  }
  c10::NoGradGuard no_grad;

  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), N));
  // Packed: the projections' matrices (per image in the folded mode, so a thread uses each
  // for N / threads tokens), where that pays; never the per-head ones (d x M, M x d), small
  // enough for MKL's no-copy kernels (packing them made stages 2-3 1.02-1.13x slower).
  const bool pack = paca_mm_gemm::packed_gemm_enabled() &&
                    paca_mm_gemm::packing_pays(C, f1, (per_head ? B * N : N) / threads);
  // out aliasing residual: the projection accumulates into it; else out = proj + residual
  const bool in_place = has_residual && residual->data_ptr() == out.data_ptr();
  const at::ThreadLocalState tls;  // grad / inference mode of the caller, for the workers
  at::parallel_for(0, B * threads, 1, [&](int64_t begin, int64_t end) {
    using paca_mm_gemm::ConstB;
    at::ThreadLocalStateGuard tls_guard(tls);
    c10::NoGradGuard guard;
    const int64_t tb = std::min(band, N);
    at::Tensor x1 = at::empty({tb, f1}, xn.options());
    at::Tensor s, o;
    if (per_head) {
      s = at::empty({tb, M}, xn.options());
      o = at::empty({tb, C}, xn.options());
    }
    // the right-hand matrices of this thread's GEMMs: the projections (per image in the
    // folded mode, shared in the per-head mode) and, per image, each head's keys and values
    std::optional<ConstB> w_in_p, w_out_p;
    std::vector<ConstB> kt_p, v_p;
    int64_t image = -1;  // the image they were set up for
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / threads, k = task % threads;
      const int64_t T0 = N * k / threads, T1 = N * (k + 1) / threads;
      if (!w_in_p || (!per_head && image != bi)) {
        w_in_p.emplace(w_in[per_head ? 0 : bi].t(), tb, pack);
        w_out_p.emplace(w_out[per_head ? 0 : bi].t(), tb, pack);
      }
      if (per_head && image != bi) {
        kt_p.clear(), v_p.clear();
        for (int64_t h = 0; h < heads; ++h) {
          kt_p.emplace_back((*kt_opt)[bi][h], tb, false);  // (d, M)
          v_p.emplace_back((*v_opt)[bi].narrow(1, h * d, d), tb, false);  // (M, d), stride C
        }
      }
      image = bi;
      const float* xb = xn.data_ptr<float>() + bi * N * C;
      float* ob = out.data_ptr<float>() + bi * N * C;
      const float* rb = has_residual ? residual->data_ptr<float>() + bi * N * C : nullptr;
      const float* score_bias = b_in[bi].data_ptr<float>();
      const float* b_out = has_b_out ? b_out_opt->data_ptr<float>() : nullptr;
      float* x1p = x1.data_ptr<float>();
      for (int64_t t0 = T0; t0 < T1; t0 += tb) {
        const int64_t n = std::min(tb, T1 - t0);
        w_in_p->mm(xb + t0 * C, n, C, x1p, f1, false);
        const float* mixed = x1p;
        if (per_head) {
          float* sp = s.data_ptr<float>();
          float* op = o.data_ptr<float>();
          for (int64_t h = 0; h < heads; ++h) {
            kt_p[h].mm(x1p + h * d, n, f1, sp, M, false);
            softmax_segments(sp, n, M, 1, M, score_bias + h * M);
            v_p[h].mm(sp, n, M, op + h * d, C, false);
          }
          mixed = op;
        } else {
          softmax_segments(x1p, n, f1, heads, M, score_bias);
        }
        float* dst = ob + t0 * C;
        w_out_p->mm(mixed, n, f1, dst, C, in_place);
        paca_mm_gemm::add_rows(dst, n, C, C, b_out, in_place ? nullptr : rb ? rb + t0 * C : nullptr,
                               C);
      }
    }
  });
}

TORCH_LIBRARY_FRAGMENT(paca_mm, m) {
  m.def(
      "p2c_attention_inference(Tensor xn, Tensor w_in, Tensor b_in, Tensor? kt, Tensor? v, "
      "Tensor w_out, Tensor? b_out, Tensor? residual, Tensor(a!) out, int heads, int band) -> ()");
}

TORCH_LIBRARY_IMPL(paca_mm, CPU, m) {
  m.impl("p2c_attention_inference", p2c_attention_inference);
}
