// ampcore's one-pass CPU master update for torch's default (for-loop) optimizer flavour:
// torch.optim.adam._single_tensor_adam (Adam, and AdamW: Adam with decoupled weight decay)
// and torch.optim.sgd._single_tensor_sgd (with and without momentum), transcribed.
//
// torch's for-loop runs one ATen elementwise op per line of the update (neg, add(alpha=),
// mul_, lerp_, addcmul_, sqrt, div, add_, maximum, addcdiv_, clone), each a pass of its own
// over memory that rounds its result to float32.  O2 runs them on the float32 masters, after
// widening the low-precision gradients and before refreshing the low-precision parameters,
// in passes of their own.  Here, per tensor, one pass does it all: read the bfloat16/float16
// gradient, widen it exactly, do each op's float32 arithmetic in the op's order with the
// op's roundings, write the master, the states and the rounded parameter.
//
// What makes it bit-identical to torch's ops (measured against them, not read off their
// source; ampcore/_o2/onepass_loop.py checks it again at first use):
// * `contract`: torch's AVX2/AVX512 kernels are built with FMA and GCC's default
//   -ffp-contract=fast, so `a + alpha * b` (add, add_ with alpha=), `self + value * t1 * t2`
//   (addcmul_: the product `value * t1` rounded, then fused) and lerp's multiply-add are one
//   fused multiply-add, in the vector body and in the scalar tail alike; its DEFAULT kernels
//   fuse none.  This file is built with -ffp-contract=off, so it fuses exactly what `madd`
//   says.  addcdiv_'s `self + value * t1 / t2` has no product next to its add.
// * lerp_ with a scalar weight: the vector body (whole runs of `lerp_width` elements from the
//   start of each TensorIterator thread chunk) computes `fmadd(coeff, end - self, base)`, the
//   scalar tail `weight < 0.5 ? self + weight * diff : end - diff * (1 - weight)`.  They
//   differ only in the sign of a zero when the weight is 1 (beta1 = 0), but they do.
// * thread chunks: at::parallel_for(0, numel, GRAIN_SIZE) (built with -fopenmp: else it runs
//   serially), as TensorIterator splits a
//   contiguous tensor (the same runtime: the same chunks for the same thread count).
// * Python-float scalars (bias corrections, step size, `bias_correction2 ** 0.5`) in double,
//   as torch's Python computes them, converted to float where the op converts its Scalar.

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "onepass_common.h"

namespace {

struct Layout {
  int64_t lerp_width;  // the run of elements lerp_'s vector body takes at a time
  bool contract;       // multiply-adds fused (torch's AVX2/AVX512 builds)
};

// [begin, end) of one thread chunk: lerp_'s vector body [begin, body), its scalar tail after
template <typename F>
void chunks(int64_t numel, const Layout& layout, const F& part) {
  at::parallel_for(0, numel, at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
    const int64_t body = begin + (end - begin) / layout.lerp_width * layout.lerp_width;
    part(begin, body, true);
    part(body, end, false);
  });
}

// ---- Adam / AdamW (_single_tensor_adam, float lr, not capturable) ----

struct AdamK {
  bool maximize, l2, small;
  float inv_scale;  // GradScaler's inverse scale (1: none): the widened gradient times it
  float wd, keep, weight, coeff, one_minus_weight, beta2, sq_coeff, bc2_sqrt, eps, neg_step;
};

// torch's float32 sqrt (at::vml::vsqrt): MKL's vmsSqrt in high-accuracy mode where torch
// was built with MKL, which is not correctly rounded for about 1 value in 200 (and gives each
// element the same result whatever the length of the call or its position in it: measured),
// else a correctly rounded square root.  Weak: a torch without MKL leaves it null.
extern "C" __attribute__((weak)) void vmsSqrt(int n, const float* a, float* r, long long mode);
constexpr long long kVmlMode = 0x2 | 0x140000 | 0x100;  // VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE
constexpr int64_t kBlock = 256;                         // elements per block of one pass

inline void sqrt_block(const float* in, float* out, int64_t n) {
  if (vmsSqrt != nullptr) {
    vmsSqrt(static_cast<int>(n), in, out, kVmlMode);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = std::sqrt(in[i]);
  }
}

// one block of at most kBlock elements: the update up to the second moment (and its maximum),
// the square roots of the block as torch takes them, then the rest of the update
template <bool Contract, bool VecLerp, bool Amsgrad, typename low_t>
void adam_block(float* __restrict__ p, const uint16_t* __restrict__ g16, uint16_t* __restrict__ out,
                float* __restrict__ m, float* __restrict__ v, float* __restrict__ vmax, const AdamK k, int64_t n) {
  alignas(64) float second[kBlock];
  alignas(64) float root[kBlock];
  const bool small = k.small;
  for (int64_t i = 0; i < n; ++i) {
    float param = p[i];
    float g = widen<low_t>(g16[i]) * k.inv_scale;      // (the scaler's unscale: exact for 1)
    g = pick(k.maximize, -g, g);                        // grad = -grads[i]
    g = pick(k.l2, madd<Contract>(param, k.wd, g), g);  // grad.add(param, alpha=weight_decay)
    p[i] = param * k.keep;                              // param.mul_(1 - lr * weight_decay) (AdamW; else 1)
    float mi = m[i];
    const float diff = g - mi;                          // exp_avg.lerp_(grad, 1 - beta1)
    if constexpr (VecLerp) {
      mi = madd<Contract>(k.coeff, diff, pick(small, mi, g));
    } else {
      mi = pick(small, madd<Contract>(k.weight, diff, mi), madd<Contract>(-diff, k.one_minus_weight, g));
    }
    float vi = v[i] * k.beta2;                          // exp_avg_sq.mul_(beta2)
    vi = madd<Contract>(k.sq_coeff * g, g, vi);         // .addcmul_(grad, grad, value=1 - beta2)
    m[i] = mi;
    v[i] = vi;
    if constexpr (Amsgrad) {                            // torch.maximum(max_exp_avg_sq, exp_avg_sq)
      const float old = vmax[i];
      vi = pick((old != old) | (vi != vi), std::numeric_limits<float>::quiet_NaN(), pick(old < vi, vi, old));
      vmax[i] = vi;
    }
    second[i] = vi;
  }
  sqrt_block(second, root, n);
  for (int64_t i = 0; i < n; ++i) {
    const float denom = root[i] / k.bc2_sqrt + k.eps;  // (sqrt() / bias_correction2_sqrt).add_(eps)
    const float param = p[i] + k.neg_step * m[i] / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
    p[i] = param;
    out[i] = narrow<low_t>(param);
  }
}

template <bool Contract, bool VecLerp, bool Amsgrad, typename low_t>
void adam_part(float* p, const uint16_t* g16, uint16_t* out, float* m, float* v, float* vmax, const AdamK& k,
               int64_t begin, int64_t end) {
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    adam_block<Contract, VecLerp, Amsgrad, low_t>(p + b, g16 + b, out + b, m + b, v + b,
                                                  Amsgrad ? vmax + b : nullptr, k, n);
  }
}

template <typename low_t>
void adam_tensor(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& low, const at::Tensor& exp_avg,
                 const at::Tensor& exp_avg_sq, float* vmax, const AdamK& k, const Layout& layout) {
  float* p = master.data_ptr<float>();
  const auto* g = reinterpret_cast<const uint16_t*>(grad.data_ptr<low_t>());
  auto* out = reinterpret_cast<uint16_t*>(low.data_ptr<low_t>());
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  chunks(master.numel(), layout, [&](int64_t begin, int64_t end, bool vec) {
    const int key = (layout.contract ? 4 : 0) | (vec ? 2 : 0) | (vmax != nullptr ? 1 : 0);
    switch (key) {
      case 0: adam_part<false, false, false, low_t>(p, g, out, m, v, vmax, k, begin, end); break;
      case 1: adam_part<false, false, true, low_t>(p, g, out, m, v, vmax, k, begin, end); break;
      case 2: adam_part<false, true, false, low_t>(p, g, out, m, v, vmax, k, begin, end); break;
      case 3: adam_part<false, true, true, low_t>(p, g, out, m, v, vmax, k, begin, end); break;
      case 4: adam_part<true, false, false, low_t>(p, g, out, m, v, vmax, k, begin, end); break;
      case 5: adam_part<true, false, true, low_t>(p, g, out, m, v, vmax, k, begin, end); break;
      case 6: adam_part<true, true, false, low_t>(p, g, out, m, v, vmax, k, begin, end); break;
      default: adam_part<true, true, true, low_t>(p, g, out, m, v, vmax, k, begin, end); break;
    }
  });
}

// the scalars torch's Python computes for one tensor's step (in double), as its ops convert them
AdamK adam_k(double lr, double beta1, double beta2, double weight_decay, double eps, double step, bool maximize,
             bool adamw, float inv_scale) {
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const double step_size = lr / bias_correction1;
  AdamK k{};
  k.inv_scale = inv_scale;
  k.maximize = maximize;
  k.l2 = weight_decay != 0 && !adamw;
  k.wd = static_cast<float>(weight_decay);
  k.keep = weight_decay != 0 && adamw ? static_cast<float>(1 - lr * weight_decay) : 1.0f;
  k.weight = static_cast<float>(1 - beta1);
  k.small = std::abs(k.weight) < 0.5f;
  k.coeff = k.small ? k.weight : k.weight - 1.0f;
  k.one_minus_weight = 1.0f - k.weight;
  k.beta2 = static_cast<float>(beta2);
  k.sq_coeff = static_cast<float>(1 - beta2);
  k.bc2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));  // Python's `** 0.5`
  k.eps = static_cast<float>(eps);
  k.neg_step = static_cast<float>(-step_size);
  return k;
}

Layout checked_layout(int64_t lerp_width, bool contract) {
  TORCH_CHECK(lerp_width > 0, "ampcore one-pass update: lerp width ", lerp_width);
  return Layout{lerp_width, contract};
}

// GradScaler's inverse scale (a float32 CPU scalar) as the deferred unscale multiplies by it
float inverse_scale(const c10::optional<at::Tensor>& inv_scale) {
  if (!inv_scale.has_value()) return 1.0f;
  TORCH_CHECK(inv_scale->device().is_cpu() && inv_scale->scalar_type() == at::kFloat && inv_scale->numel() == 1,
              "ampcore one-pass update: inv_scale must be a float32 CPU tensor of one element");
  return *inv_scale->data_ptr<float>();
}

// torch's _single_tensor_adam on float32 masters with gradients in `lows`' dtype: per
// tensor its step count advanced, then the update, then the low-precision parameter written.
void adam(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
          const std::vector<at::Tensor>& lows, const std::vector<at::Tensor>& exp_avgs,
          const std::vector<at::Tensor>& exp_avg_sqs, const std::vector<at::Tensor>& max_exp_avg_sqs,
          const std::vector<at::Tensor>& steps, double lr, double beta1, double beta2, double weight_decay,
          double eps, bool amsgrad, bool maximize, bool adamw, const c10::optional<at::Tensor>& inv_scale,
          int64_t lerp_width, bool contract) {
  const Layout layout = checked_layout(lerp_width, contract);
  const float inv = inverse_scale(inv_scale);
  const size_t n = masters.size();
  TORCH_CHECK(grads.size() == n && lows.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                  steps.size() == n && (!amsgrad || max_exp_avg_sqs.size() == n),
              "ampcore one-pass update: lists of different lengths");
  for (size_t i = 0; i < n; ++i) {  // every tensor checked before any is written
    const at::Tensor& master = masters[i];
    check_tensor(master, at::kFloat, master, "a master");
    TORCH_CHECK(lows[i].scalar_type() == at::kBFloat16 || lows[i].scalar_type() == at::kHalf,
                "ampcore one-pass update: a low-precision parameter of ", lows[i].scalar_type());
    check_tensor(lows[i], lows[i].scalar_type(), master, "a low-precision parameter");
    check_tensor(grads[i], lows[i].scalar_type(), master, "a gradient");
    check_tensor(exp_avgs[i], at::kFloat, master, "exp_avg");
    check_tensor(exp_avg_sqs[i], at::kFloat, master, "exp_avg_sq");
    if (amsgrad) check_tensor(max_exp_avg_sqs[i], at::kFloat, master, "max_exp_avg_sq");
    TORCH_CHECK(steps[i].device().is_cpu() && steps[i].scalar_type() == at::kFloat && steps[i].numel() == 1,
                "ampcore one-pass update: a step count must be a float32 CPU tensor of one element");
  }
  for (size_t i = 0; i < n; ++i) {
    float* count = steps[i].data_ptr<float>();
    *count = *count + 1.0f;  // step_t += 1; step = step_t.item()
    const AdamK k = adam_k(lr, beta1, beta2, weight_decay, eps, *count, maximize, adamw, inv);
    float* vmax = amsgrad ? max_exp_avg_sqs[i].data_ptr<float>() : nullptr;
    if (lows[i].scalar_type() == at::kBFloat16) {
      adam_tensor<c10::BFloat16>(masters[i], grads[i], lows[i], exp_avgs[i], exp_avg_sqs[i], vmax, k, layout);
    } else {
      adam_tensor<c10::Half>(masters[i], grads[i], lows[i], exp_avgs[i], exp_avg_sqs[i], vmax, k, layout);
    }
  }
}

// ---- SGD (_single_tensor_sgd, float lr; ampcore's own momentum-free update is the same) ----

struct SgdK {
  bool maximize, decay, nesterov;
  float inv_scale, wd, mom, keep_grad, neg_lr;
};

template <bool Contract, int Momentum, typename low_t>  // Momentum: 0 none, 1 first step, 2 later
void sgd_part(float* __restrict__ p, const uint16_t* __restrict__ g16, uint16_t* __restrict__ out,
              float* __restrict__ buf, const SgdK k, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float param = p[i];
    float g = widen<low_t>(g16[i]) * k.inv_scale;  // (the scaler's unscale: exact for 1)
    g = pick(k.maximize, -g, g);
    g = pick(k.decay, madd<Contract>(param, k.wd, g), g);  // grad.add(param, alpha=weight_decay)
    if constexpr (Momentum != 0) {
      float b = g;  // first step: buf = grad.clone()
      if constexpr (Momentum == 2) b = madd<Contract>(g, k.keep_grad, buf[i] * k.mom);  // buf.mul_().add_()
      buf[i] = b;
      g = pick(k.nesterov, madd<Contract>(b, k.mom, g), b);  // grad.add(buf, alpha=momentum), or buf
    }
    param = madd<Contract>(g, k.neg_lr, param);  // param.add_(grad, alpha=-lr)
    p[i] = param;
    out[i] = narrow<low_t>(param);
  }
}

template <typename low_t>
void sgd_tensor(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& low, float* buf, int momentum,
                const SgdK& k, const Layout& layout) {
  float* p = master.data_ptr<float>();
  const auto* g = reinterpret_cast<const uint16_t*>(grad.data_ptr<low_t>());
  auto* out = reinterpret_cast<uint16_t*>(low.data_ptr<low_t>());
  at::parallel_for(0, master.numel(), at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
    const int key = (layout.contract ? 3 : 0) + momentum;
    switch (key) {
      case 0: sgd_part<false, 0, low_t>(p, g, out, buf, k, begin, end); break;
      case 1: sgd_part<false, 1, low_t>(p, g, out, buf, k, begin, end); break;
      case 2: sgd_part<false, 2, low_t>(p, g, out, buf, k, begin, end); break;
      case 3: sgd_part<true, 0, low_t>(p, g, out, buf, k, begin, end); break;
      case 4: sgd_part<true, 1, low_t>(p, g, out, buf, k, begin, end); break;
      default: sgd_part<true, 2, low_t>(p, g, out, buf, k, begin, end); break;
    }
  });
}

// torch's _single_tensor_sgd on float32 masters with gradients in `lows`' dtype; with
// momentum, `bufs[i]` is the momentum buffer, filled with the gradient where `first[i]`
// (torch's `buf is None`: the caller made it, as torch's clone would be).
void sgd(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
         const std::vector<at::Tensor>& lows, const std::vector<at::Tensor>& bufs, const std::vector<bool>& first,
         double weight_decay, double momentum, double lr, double dampening, bool nesterov, bool maximize,
         const c10::optional<at::Tensor>& inv_scale, int64_t lerp_width, bool contract) {
  const Layout layout = checked_layout(lerp_width, contract);
  const size_t n = masters.size();
  const bool with_momentum = momentum != 0;
  TORCH_CHECK(grads.size() == n && lows.size() == n && (!with_momentum || (bufs.size() == n && first.size() == n)),
              "ampcore one-pass update: lists of different lengths");
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& master = masters[i];
    check_tensor(master, at::kFloat, master, "a master");
    TORCH_CHECK(lows[i].scalar_type() == at::kBFloat16 || lows[i].scalar_type() == at::kHalf,
                "ampcore one-pass update: a low-precision parameter of ", lows[i].scalar_type());
    check_tensor(lows[i], lows[i].scalar_type(), master, "a low-precision parameter");
    check_tensor(grads[i], lows[i].scalar_type(), master, "a gradient");
    if (with_momentum) check_tensor(bufs[i], at::kFloat, master, "a momentum buffer");
  }
  const SgdK k{maximize, weight_decay != 0, nesterov, inverse_scale(inv_scale), static_cast<float>(weight_decay),
               static_cast<float>(momentum),
               static_cast<float>(1 - dampening), static_cast<float>(-lr)};
  for (size_t i = 0; i < n; ++i) {
    float* buf = with_momentum ? bufs[i].data_ptr<float>() : nullptr;
    const int kind = with_momentum ? (first[i] ? 1 : 2) : 0;
    if (lows[i].scalar_type() == at::kBFloat16) {
      sgd_tensor<c10::BFloat16>(masters[i], grads[i], lows[i], buf, kind, k, layout);
    } else {
      sgd_tensor<c10::Half>(masters[i], grads[i], lows[i], buf, kind, k, layout);
    }
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("adam", &adam, "torch's for-loop Adam/AdamW from low-precision gradients, in one pass per tensor");
  m.def("sgd", &sgd, "torch's for-loop SGD from low-precision gradients, in one pass per tensor");
}
