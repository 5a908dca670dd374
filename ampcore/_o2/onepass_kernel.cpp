// ampcore's one-pass CPU master update: torch's CPU fused Adam/AdamW and SGD, transcribed.
//
// Per tensor, one pass over memory: read the low-precision (bfloat16/float16) gradient,
// widen it exactly, apply the arithmetic of torch's CPU fused kernel
// (aten/src/ATen/native/cpu/FusedAdamKernel.cpp, FusedSGDKernel.cpp, the float32 `adam_math`
// and `sgd_math`) to the float32 master and its states, and write the master rounded to the
// low-precision parameter (round to nearest even, as torch's copy_ rounds).  torch's kernels
// read float32 gradients, so O2 otherwise widens the gradients and refreshes the parameters
// in passes of their own.
//
// Bit-identity with torch's kernel on float32 masters rests on doing, per element, the same
// correctly rounded float32 operations in the same order (this file is built with
// -ffp-contract=off, so the compiler fuses nothing the source does not say), and on
// splitting the elements as torch does: at::parallel_for(0, units, 0) over 64-byte units of
// the float32 master (the same runtime, so the same chunks for the same thread count), in
// each chunk a vector body of whole vectors of `width` floats (torch's
// Vectorized<float>::size() at its dispatched CPU capability) and a scalar tail, of which
// GCC vectorised the first whole `tail_width` elements.  The three parts round differently
// where torch's build contracts multiply-adds (`contract`: its AVX2/AVX512 kernels, built
// with FMA and GCC's default -ffp-contract=fast).  Python passes these for torch's
// capability and checks the result against torch's own kernel on this machine before using
// it (ampcore/_o2/onepass.py).
//
// What both one-pass kernels share is in onepass_common.h; the AVX512 vector bodies spelled
// with intrinsics (for streamed parameter stores) in onepass_avx512.h.

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "onepass_avx512.h"
#include "onepass_common.h"

namespace {

constexpr int64_t kUnit = 64 / sizeof(float);  // torch's cache_line_aligned_task_unit

// x * y + (u * v): with contraction one of the two products is fused into the add: GCC
// fuses the first multiplication in its statement order, which is `x * y` in scalar code and
// `u * v` in vectorised code (`Vector`: torch's vector body, and the part of its scalar tail
// loop that GCC vectorised), as measured against torch's kernels
template <bool Contract, bool Vector>
inline float madd2(float x, float y, float u, float v) {
  if constexpr (!Contract) {
    return x * y + u * v;
  } else if constexpr (Vector) {
    return std::fma(u, v, x * y);
  } else {
    return std::fma(x, y, u * v);
  }
}

// what torch's fused Adam and SGD first do to every gradient element: unscale it
// (GradScaler), negate it (maximize), add the L2 decay term (Adam's and SGD's
// `weight_decay`; AdamW decays the parameter instead)
struct GradConsts {
  bool maximize, decay;
  float scale, sign, wd;
};

GradConsts grad_consts(const float* scale, bool maximize, bool decay, double weight_decay) {
  return GradConsts{maximize, decay, scale ? *scale : 1.0f, maximize ? -1.0f : 1.0f, static_cast<float>(weight_decay)};
}

// the gradient element torch's kernel goes on with, from the low-precision gradient `g16`
// and the master's `param` (vector code negates by a multiplication, scalar code by `-`)
template <bool Contract, bool Vector, bool Scaled, typename low_t>
inline float grad_of(uint16_t g16, float param, const GradConsts& k) {
  float g = widen<low_t>(g16);
  if constexpr (Scaled) g = g / k.scale;
  if constexpr (Vector) {
    g = g * k.sign;  // maximize: -1, else 1
  } else {
    g = k.maximize ? -g : g;
  }
  return pick(k.decay, madd<Contract>(param, k.wd, g), g);
}

// The low-precision parameter is the one tensor the update writes without reading it.  An
// ordinary store first reads each of its cache lines (read for ownership): 2 bytes per
// parameter that the update does not need, on top of the 12 (SGD) it does.  In the vector
// body of the AVX512 build the rounded parameters of tensors of at least `g_stream_min`
// elements go out with non-temporal stores instead, which read nothing (a smaller tensor
// stays in cache for the next forward).  Only how the values are stored changes: the
// arithmetic is the same, bit for bit.
int64_t g_stream_min = int64_t{1} << 20;

bool streamed(const at::Tensor& low) {
  return AMPCORE_ONEPASS_AVX512 && low.numel() >= g_stream_min && reinterpret_cast<uintptr_t>(low.data_ptr()) % 32 == 0;
}

struct AdamConsts {
  GradConsts grad;
  bool scaled, amsgrad, small, contract, stream;
  float keep, weight, coeff, one_minus_weight, beta2, sq_coeff, bc2_sqrt, eps, step_size;
};

AdamConsts adam_consts(double lr, double beta1, double beta2, double weight_decay, double eps, double step,
                       bool amsgrad, bool maximize, bool adamw, const float* scale, bool contract) {
  AdamConsts k{};
  // double where torch's kernel computes in double, rounded to float where it casts
  double bias_correction1 = 1 - std::pow(beta1, step);
  double bias_correction2 = 1 - std::pow(beta2, step);
  const bool decay = weight_decay != 0.f;
  k.grad = grad_consts(scale, maximize, decay && !adamw, weight_decay);
  k.scaled = scale != nullptr;
  k.amsgrad = amsgrad;
  k.contract = contract;
  k.keep = adamw && decay ? static_cast<float>(1 - lr * weight_decay) : 1.0f;
  k.weight = static_cast<float>(1 - beta1);
  k.small = std::abs(k.weight) < 0.5f;
  k.coeff = k.small ? k.weight : k.weight - 1.0f;
  k.one_minus_weight = 1.0f - k.weight;
  k.beta2 = static_cast<float>(beta2);
  k.sq_coeff = static_cast<float>(1 - beta2);
  k.bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  k.eps = static_cast<float>(eps);
  k.step_size = static_cast<float>(lr / bias_correction1);
  return k;
}

// torch's `adam_math<float>` on [begin, end) of one of its parts: the vector body
// (`Vector`), or its scalar tail loop (of which GCC vectorised the first whole vectors:
// `Vector` too).  The lerp of the body (one fmadd of `coeff` and `base`) equals the tail's
// two branches except in the sign of a zero when beta1 is 0; the rest differs only in how a
// multiply-add is contracted (madd2) and in `maximum` against `std::max` (NaN).  Options
// are selects, so that the loop vectorises.
template <bool Contract, bool Vector, bool Tail, bool Amsgrad, bool Scaled, typename low_t>
void adam_part(float* __restrict__ p, const uint16_t* __restrict__ g16, uint16_t* __restrict__ out,
               float* __restrict__ m, float* __restrict__ v, float* __restrict__ vmax, const AdamConsts k,
               int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float param = p[i];
    const float g = grad_of<Contract, Vector, Scaled, low_t>(g16[i], param, k.grad);
    param = param * k.keep;  // 1 but for AdamW's decay
    float mi = m[i], diff = g - mi;
    if constexpr (Tail && !Vector) {
      mi = pick(k.small, madd<Contract>(k.weight, diff, mi), madd<Contract>(-diff, k.one_minus_weight, g));
    } else {
      mi = madd<Contract>(k.coeff, diff, pick(k.small, mi, g));  // vec::fmadd
    }
    float vi = madd2<Contract, Vector>(v[i], k.beta2, k.sq_coeff * g, g);
    m[i] = mi;
    v[i] = vi;
    float s = vi;
    if constexpr (Amsgrad) {
      float old = vmax[i];
      if constexpr (Vector) {  // Vectorized<float>'s maximum: NaN if either is
        s = pick((old != old) | (vi != vi), std::numeric_limits<float>::quiet_NaN(), pick(old > vi, old, vi));
      } else {  // std::max
        s = pick(old < vi, vi, old);
      }
      vmax[i] = s;
    }
    float denom = std::sqrt(s) / k.bc2_sqrt + k.eps;
    param = param - k.step_size * mi / denom;  // the body's `p + (-step_size * m) / denom`
    p[i] = param;
    out[i] = narrow<low_t>(param);
  }
}

struct Split {
  int64_t width;       // torch's Vectorized<float>::size()
  int64_t tail_width;  // the vector width GCC gave torch's tail loop (0: not vectorised)
  // [begin, body) vector body, [body, vec) vectorised tail, [vec, end) scalar tail
  void of(int64_t begin, int64_t end, int64_t& body, int64_t& vec) const {
    body = end - (end - begin) % width;
    vec = tail_width ? body + (end - body) / tail_width * tail_width : body;
  }
};

template <typename low_t>
struct AdamTensors {
  float* p;
  const uint16_t* g;
  uint16_t* out;
  float* m;
  float* v;
  float* vmax;
};

template <bool Contract, bool Amsgrad, bool Scaled, typename low_t>
void adam_parts(const AdamTensors<low_t>& t, const AdamConsts& k, const Split& split, int64_t begin, int64_t end) {
  int64_t body, vec;
  split.of(begin, end, body, vec);
  int64_t done = begin;  // in the AVX512 build whole vectors of the body by adam_avx512
#if AMPCORE_ONEPASS_AVX512
  if constexpr (Contract && std::is_same_v<low_t, c10::BFloat16>) {
    done = k.stream ? adam_avx512<Amsgrad, Scaled, true>(t, k, begin, body)
                    : adam_avx512<Amsgrad, Scaled, false>(t, k, begin, body);
  }
#endif
  adam_part<Contract, true, false, Amsgrad, Scaled, low_t>(t.p, t.g, t.out, t.m, t.v, t.vmax, k, done, body);
  adam_part<Contract, true, true, Amsgrad, Scaled, low_t>(t.p, t.g, t.out, t.m, t.v, t.vmax, k, body, vec);
  adam_part<Contract, false, true, Amsgrad, Scaled, low_t>(t.p, t.g, t.out, t.m, t.v, t.vmax, k, vec, end);
}

template <bool Contract, bool Amsgrad, typename low_t>
void adam_range(const AdamTensors<low_t>& t, const AdamConsts& k, const Split& split, int64_t begin, int64_t end) {
  if (k.scaled) {
    adam_parts<Contract, Amsgrad, true, low_t>(t, k, split, begin, end);
  } else {
    adam_parts<Contract, Amsgrad, false, low_t>(t, k, split, begin, end);
  }
}

template <typename low_t>
void adam_tensor(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& low, const at::Tensor& exp_avg,
                 const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq, const AdamConsts& k,
                 const Split& split) {
  AdamTensors<low_t> t{master.data_ptr<float>(),
                       reinterpret_cast<const uint16_t*>(grad.data_ptr<low_t>()),
                       reinterpret_cast<uint16_t*>(low.data_ptr<low_t>()),
                       exp_avg.data_ptr<float>(),
                       exp_avg_sq.data_ptr<float>(),
                       k.amsgrad ? max_exp_avg_sq.data_ptr<float>() : nullptr};
  const int64_t numel = master.numel();
  at::parallel_for(0, (numel + kUnit - 1) / kUnit, 0, [&](int64_t begin, int64_t end) {
    begin *= kUnit;
    end = std::min(end * kUnit, numel);
    if (k.contract) {
      k.amsgrad ? adam_range<true, true>(t, k, split, begin, end) : adam_range<true, false>(t, k, split, begin, end);
    } else {
      k.amsgrad ? adam_range<false, true>(t, k, split, begin, end) : adam_range<false, false>(t, k, split, begin, end);
    }
    stream_fence(k.stream);
  });
}

struct SgdConsts {
  GradConsts grad;
  bool scaled, momentum, first, nesterov, contract, stream;
  float mom, keep_grad, lr;
};

// torch's `sgd_math<float>` on [begin, end) of one of its parts (its body's `p + g * -lr`
// is its tail's `p - g * lr`).
template <bool Contract, bool Vector, bool Momentum, bool Scaled, typename low_t>
void sgd_part(float* __restrict__ p, const uint16_t* __restrict__ g16, uint16_t* __restrict__ out,
              float* __restrict__ buf, const SgdConsts k, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float param = p[i];
    float g = grad_of<Contract, Vector, Scaled, low_t>(g16[i], param, k.grad);
    if constexpr (Momentum) {
      float b = pick(k.first, g, madd2<Contract, Vector>(buf[i], k.mom, g, k.keep_grad));
      buf[i] = b;
      g = pick(k.nesterov, madd<Contract>(b, k.mom, g), b);
    }
    param = madd<Contract>(-g, k.lr, param);
    p[i] = param;
    out[i] = narrow<low_t>(param);
  }
}

// torch's vector body and the vectorised part of its tail ([begin, vec): the same
// arithmetic), then its scalar tail; in the AVX512 build whole vectors by sgd_avx512
template <bool Contract, bool Momentum, bool Scaled, typename low_t>
void sgd_parts(float* p, const uint16_t* g, uint16_t* out, float* buf, const SgdConsts& k, int64_t begin,
               int64_t vec, int64_t end) {
  int64_t done = begin;
#if AMPCORE_ONEPASS_AVX512
  if constexpr (Contract && std::is_same_v<low_t, c10::BFloat16>) {
    done = k.stream ? sgd_avx512<Momentum, Scaled, true>(p, g, out, buf, k, begin, vec)
                    : sgd_avx512<Momentum, Scaled, false>(p, g, out, buf, k, begin, vec);
  }
#endif
  sgd_part<Contract, true, Momentum, Scaled, low_t>(p, g, out, buf, k, done, vec);
  sgd_part<Contract, false, Momentum, Scaled, low_t>(p, g, out, buf, k, vec, end);
}

template <bool Contract, bool Momentum, typename low_t>
void sgd_range(float* p, const uint16_t* g, uint16_t* out, float* buf, const SgdConsts& k, const Split& split,
               int64_t begin, int64_t end) {
  int64_t body, vec;
  split.of(begin, end, body, vec);
  if (k.scaled) {
    sgd_parts<Contract, Momentum, true, low_t>(p, g, out, buf, k, begin, vec, end);
  } else {
    sgd_parts<Contract, Momentum, false, low_t>(p, g, out, buf, k, begin, vec, end);
  }
}


template <typename low_t>
void sgd_tensor(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& low, const at::Tensor& buf,
                SgdConsts k, const Split& split) {
  k.stream = streamed(low);
  float* p = master.data_ptr<float>();
  const uint16_t* g = reinterpret_cast<const uint16_t*>(grad.data_ptr<low_t>());
  uint16_t* out = reinterpret_cast<uint16_t*>(low.data_ptr<low_t>());
  float* b = k.momentum ? buf.data_ptr<float>() : nullptr;
  const int64_t numel = master.numel();
  at::parallel_for(0, (numel + kUnit - 1) / kUnit, 0, [&](int64_t begin, int64_t end) {
    begin *= kUnit;
    end = std::min(end * kUnit, numel);
    if (k.contract) {
      k.momentum ? sgd_range<true, true, low_t>(p, g, out, b, k, split, begin, end)
                 : sgd_range<true, false, low_t>(p, g, out, b, k, split, begin, end);
    } else {
      k.momentum ? sgd_range<false, true, low_t>(p, g, out, b, k, split, begin, end)
                 : sgd_range<false, false, low_t>(p, g, out, b, k, split, begin, end);
    }
    stream_fence(k.stream);
  });
}

const float* scale_of(const c10::optional<at::Tensor>& grad_scale) {
  return grad_scale.has_value() ? grad_scale->data_ptr<float>() : nullptr;
}

Split checked_split(int64_t width, int64_t tail_width) {
  TORCH_CHECK(width > 0 && kUnit % width == 0 && tail_width >= 0 && tail_width < width,
              "ampcore one-pass update: vector widths ", width, ", ", tail_width);
  return Split{width, tail_width};
}

bool skipped(const c10::optional<at::Tensor>& found_inf) {
  return found_inf.has_value() && *found_inf->data_ptr<float>() == 1.0f;
}

// torch._fused_adam_/_fused_adamw_ on float32 masters with gradients `grads` in
// `lows`' dtype (the step counts already advanced, as torch's _fused_adam does).
void adam(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
          const std::vector<at::Tensor>& lows, const std::vector<at::Tensor>& exp_avgs,
          const std::vector<at::Tensor>& exp_avg_sqs, const std::vector<at::Tensor>& max_exp_avg_sqs,
          const std::vector<at::Tensor>& steps, double lr, double beta1, double beta2, double weight_decay,
          double eps, bool amsgrad, bool maximize, bool adamw, const c10::optional<at::Tensor>& grad_scale,
          const c10::optional<at::Tensor>& found_inf, int64_t width, int64_t tail_width, bool contract) {
  const Split split = checked_split(width, tail_width);
  if (skipped(found_inf)) return;
  for (size_t i = 0; i < masters.size(); ++i) {
    const at::Tensor& master = masters[i];
    const at::ScalarType low_type = lows[i].scalar_type();
    check_tensor(master, at::kFloat, master, "a master");
    check_tensor(grads[i], low_type, master, "a gradient");
    check_tensor(exp_avgs[i], at::kFloat, master, "exp_avg");
    check_tensor(exp_avg_sqs[i], at::kFloat, master, "exp_avg_sq");
    if (amsgrad) check_tensor(max_exp_avg_sqs[i], at::kFloat, master, "max_exp_avg_sq");
    TORCH_CHECK(steps[i].device().is_cpu() && steps[i].scalar_type() == at::kFloat && steps[i].numel() == 1,
                "ampcore one-pass update: a step count must be a float32 CPU tensor of one element");
    const double step = *steps[i].data_ptr<float>();  // (what torch's kernel reads with item<float>())
    AdamConsts k = adam_consts(lr, beta1, beta2, weight_decay, eps, step, amsgrad, maximize, adamw,
                               scale_of(grad_scale), contract);
    k.stream = streamed(lows[i]);
    const at::Tensor& vmax = amsgrad ? max_exp_avg_sqs[i] : exp_avg_sqs[i];
    if (low_type == at::kBFloat16) {
      adam_tensor<c10::BFloat16>(master, grads[i], lows[i], exp_avgs[i], exp_avg_sqs[i], vmax, k, split);
    } else {
      TORCH_CHECK(low_type == at::kHalf, "ampcore one-pass update: low-precision dtype ", low_type);
      adam_tensor<c10::Half>(master, grads[i], lows[i], exp_avgs[i], exp_avg_sqs[i], vmax, k, split);
    }
  }
}

// torch._fused_sgd_ on float32 masters with gradients in `lows`' dtype.
void sgd(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
         const std::vector<at::Tensor>& lows, const std::vector<at::Tensor>& bufs, double weight_decay,
         double momentum, double lr, double dampening, bool nesterov, bool maximize, bool is_first_step,
         const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf, int64_t width, int64_t tail_width, bool contract) {
  const Split split = checked_split(width, tail_width);
  if (skipped(found_inf)) return;
  const float* scale = scale_of(grad_scale);
  SgdConsts k{grad_consts(scale, maximize, weight_decay != 0.0, weight_decay),
              scale != nullptr, momentum != 0.0, is_first_step, nesterov, contract, false,
              static_cast<float>(momentum), static_cast<float>(1 - dampening), static_cast<float>(lr)};
  for (size_t i = 0; i < masters.size(); ++i) {
    const at::Tensor& master = masters[i];
    const at::ScalarType low_type = lows[i].scalar_type();
    check_tensor(master, at::kFloat, master, "a master");
    check_tensor(grads[i], low_type, master, "a gradient");
    if (k.momentum) check_tensor(bufs[i], at::kFloat, master, "a momentum buffer");
    const at::Tensor& buf = k.momentum ? bufs[i] : master;
    if (low_type == at::kBFloat16) {
      sgd_tensor<c10::BFloat16>(master, grads[i], lows[i], buf, k, split);
    } else {
      TORCH_CHECK(low_type == at::kHalf, "ampcore one-pass update: low-precision dtype ", low_type);
      sgd_tensor<c10::Half>(master, grads[i], lows[i], buf, k, split);
    }
  }
}

}  // namespace

// the size from which the parameter is streamed (tests: 0, every tensor); the one before
int64_t set_stream_min(int64_t elements) {
  TORCH_CHECK(elements >= 0, "ampcore one-pass update: stream_min ", elements);
  const int64_t before = g_stream_min;
  g_stream_min = elements;
  return before;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_stream_min", &set_stream_min, "the size (elements) from which the parameter is streamed; the old one");
  m.def("adam", &adam, "torch's CPU fused Adam/AdamW from low-precision gradients, in one pass");
  m.def("sgd", &sgd, "torch's CPU fused SGD from low-precision gradients, in one pass");
}
