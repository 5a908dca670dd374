// What both one-pass kernels (onepass_kernel.cpp: torch's fused Adam/AdamW/SGD;
// onepass_loop_kernel.cpp: its for-loop flavour) do alike: a multiply-add rounded as torch's
// build rounds it, branch-free selects, the low-precision types as their 16 bits, and the
// check of a tensor argument.  Included by one translation unit per extension.

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

// a * b + c as torch's build computes it: one fused multiply-add where its compiler
// contracted it (torch's AVX2/AVX512 kernels are built with FMA and GCC's default
// -ffp-contract=fast), else a multiply and an add (this file is built with -ffp-contract=off)
template <bool Contract>
inline float madd(float a, float b, float c) {
  if constexpr (Contract) {
    return std::fma(a, b, c);
  } else {
    return a * b + c;
  }
}

inline uint32_t bits_of(float value) {
  uint32_t out;
  std::memcpy(&out, &value, sizeof(out));
  return out;
}

inline float float_of(uint32_t bits) {
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// `yes ? a : b` by bit masks: both computed, no branch (so that the loops vectorise)
inline float pick(bool yes, float a, float b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(yes);
  return float_of((bits_of(a) & mask) | (bits_of(b) & ~mask));
}

// the low-precision types as their 16 bits (so that the loops vectorise)
template <typename low_t>
inline float widen(uint16_t x) {
  if constexpr (std::is_same_v<low_t, c10::BFloat16>) {
    return float_of(static_cast<uint32_t>(x) << 16);
  } else {
    return static_cast<float>(c10::Half(x, c10::Half::from_bits()));
  }
}

// rounded to nearest even, as torch's copy_ rounds (a NaN becomes a quiet NaN)
template <typename low_t>
inline uint16_t narrow(float value) {
  if constexpr (std::is_same_v<low_t, c10::BFloat16>) {
    const uint32_t u = bits_of(value);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = 0u - static_cast<uint32_t>((u & 0x7FFFFFFFu) > 0x7F800000u);
    return static_cast<uint16_t>((0x7FC0u & nan) | (rounded & ~nan));
  } else {
    return c10::Half(value).x;
  }
}

inline void check_tensor(const at::Tensor& t, at::ScalarType dtype, const at::Tensor& master, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == dtype && t.numel() == master.numel(),
              "ampcore one-pass update: ", what, " must be a contiguous CPU tensor of ", c10::toString(dtype),
              " with the master's ", master.numel(), " elements");
}

}  // namespace
