// The fused kernel's AVX512 vector bodies for bfloat16 (onepass_kernel.cpp): Adam/AdamW's and
// SGD's arithmetic of torch's vector body spelled with intrinsics, the same float32
// operations element by element (each `_mm512_fmadd_ps` one rounding, where the kernel's
// `madd`/`madd2` contract), so that the rounded parameter can go out with non-temporal
// stores (`Stream`).  `Consts` and `Tensors` are the kernel's AdamConsts/SgdConsts and
// AdamTensors.  Built only where the extension is compiled for AVX512 (BW); elsewhere
// AMPCORE_ONEPASS_AVX512 is 0 and the kernel's loops run alone.  Included by one
// translation unit.

#pragma once

#include <cstdint>
#include <limits>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define AMPCORE_ONEPASS_AVX512 1
#else
#define AMPCORE_ONEPASS_AVX512 0
#endif

namespace {

#if AMPCORE_ONEPASS_AVX512
inline __m512 widen16(const uint16_t* g16) {  // bfloat16 -> float32, exactly
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g16));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// narrow<c10::BFloat16> on 16 floats: rounded to nearest even, a NaN to the quiet NaN
template <bool Stream>
inline void narrow16(uint16_t* out, __m512 value) {
  const __m512i u = _mm512_castps_si512(value);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  const __m256i bf16 = _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0)));
  if constexpr (Stream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), bf16);  // 32-byte aligned (`streamed`)
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bf16);
  }
}

// adam_part<true, true, false, Amsgrad, Scaled, c10::BFloat16> (torch's vector body) on whole
// vectors of 16 in [begin, end), spelled with AVX512 intrinsics (the same operations, element
// by element), so that the parameter can be streamed; returns where it stopped
template <bool Amsgrad, bool Scaled, bool Stream, typename Tensors, typename Consts>
int64_t adam_avx512(const Tensors& t, const Consts& k, int64_t begin, int64_t end) {
  const __m512 scale = _mm512_set1_ps(k.grad.scale), sign = _mm512_set1_ps(k.grad.sign);
  const __m512 wd = _mm512_set1_ps(k.grad.wd), keep = _mm512_set1_ps(k.keep), coeff = _mm512_set1_ps(k.coeff);
  const __m512 beta2 = _mm512_set1_ps(k.beta2), sq_coeff = _mm512_set1_ps(k.sq_coeff);
  const __m512 bc2_sqrt = _mm512_set1_ps(k.bc2_sqrt), eps = _mm512_set1_ps(k.eps);
  const __m512 step_size = _mm512_set1_ps(k.step_size), nan = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
  float* __restrict__ p = t.p;
  float* __restrict__ m = t.m;
  float* __restrict__ v = t.v;
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 param = _mm512_loadu_ps(p + i);
    __m512 g = widen16(t.g + i);
    if constexpr (Scaled) g = _mm512_div_ps(g, scale);
    g = _mm512_mul_ps(g, sign);
    if (k.grad.decay) g = _mm512_fmadd_ps(param, wd, g);
    param = _mm512_mul_ps(param, keep);
    __m512 mi = _mm512_loadu_ps(m + i);
    const __m512 diff = _mm512_sub_ps(g, mi);
    mi = _mm512_fmadd_ps(coeff, diff, k.small ? mi : g);  // the lerp: vec::fmadd
    // madd2<true, true>(v, beta2, sq_coeff * g, g): the second product fused
    const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(sq_coeff, g), g, _mm512_mul_ps(_mm512_loadu_ps(v + i), beta2));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    __m512 s = vi;
    if constexpr (Amsgrad) {  // Vectorized<float>'s maximum: NaN if either is
      const __m512 old = _mm512_loadu_ps(t.vmax + i);
      s = _mm512_mask_mov_ps(_mm512_max_ps(old, vi), _mm512_cmp_ps_mask(old, vi, _CMP_UNORD_Q), nan);
      _mm512_storeu_ps(t.vmax + i, s);
    }
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(s), bc2_sqrt), eps);
    param = _mm512_sub_ps(param, _mm512_div_ps(_mm512_mul_ps(step_size, mi), denom));
    _mm512_storeu_ps(p + i, param);
    narrow16<Stream>(t.out + i, param);
  }
  return i;
}

// sgd_part<true, true, Momentum, Scaled, c10::BFloat16> on whole vectors of 16 in
// [begin, end), spelled with AVX512 intrinsics (the same operations, element by element:
// each `fma` one rounding, as `madd`/`madd2` contract them), so that the parameter can be
// streamed; returns where it stopped (the rest, fewer than 16, for sgd_part)
template <bool Momentum, bool Scaled, bool Stream, typename Consts>
int64_t sgd_avx512(float* __restrict__ p, const uint16_t* __restrict__ g16, uint16_t* __restrict__ out,
                   float* __restrict__ buf, const Consts& k, int64_t begin, int64_t end) {
  const __m512 scale = _mm512_set1_ps(k.grad.scale), sign = _mm512_set1_ps(k.grad.sign);
  const __m512 wd = _mm512_set1_ps(k.grad.wd), mom = _mm512_set1_ps(k.mom);
  const __m512 keep_grad = _mm512_set1_ps(k.keep_grad), lr = _mm512_set1_ps(k.lr);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 param = _mm512_loadu_ps(p + i);
    __m512 g = widen16(g16 + i);
    if constexpr (Scaled) g = _mm512_div_ps(g, scale);
    g = _mm512_mul_ps(g, sign);
    if (k.grad.decay) g = _mm512_fmadd_ps(param, wd, g);
    if constexpr (Momentum) {
      // madd2<true, true>(buf, mom, g, keep_grad): the second product fused
      const __m512 b = k.first ? g : _mm512_fmadd_ps(g, keep_grad, _mm512_mul_ps(_mm512_loadu_ps(buf + i), mom));
      _mm512_storeu_ps(buf + i, b);
      g = k.nesterov ? _mm512_fmadd_ps(b, mom, g) : b;
    }
    param = _mm512_fnmadd_ps(g, lr, param);  // madd(-g, lr, param)
    _mm512_storeu_ps(p + i, param);
    narrow16<Stream>(out + i, param);
  }
  return i;
}
#endif

// the streamed stores of a thread's chunk ordered before what follows it
inline void stream_fence(bool stream) {
#if AMPCORE_ONEPASS_AVX512
  if (stream) _mm_sfence();
#endif
}

}  // namespace
