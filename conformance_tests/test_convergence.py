"""A short training run: the mixed-precision loss ends within tolerance of float32."""

from __future__ import annotations

import torch

import ampcore
from ampcore_conformance._checks import make_mlp, region, regression_data, require_feature, require_white
from ampcore_conformance._context import SuiteContext
from ampcore_conformance._manifest import Tolerances

STEPS = 120


def _train(backend: ampcore.Backend, device: torch.device, dtype: torch.dtype | None) -> list[float]:
    """Full-batch Adam on a smooth regression task; ``dtype=None`` trains in float32."""
    x, y = regression_data(device, n=128)
    model = make_mlp(device, width=32, depth=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = ampcore.GradScaler(backend.name, dtype=dtype) if dtype is not None else None
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with region(backend, dtype or backend.default_dtype, enabled=dtype is not None):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(float(loss.detach().cpu()))
    return losses


def test_training_converges_like_fp32(
    amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype,
    amp_tolerances: Tolerances,
) -> None:  # fmt: skip
    require_feature(ampcore, "GradScaler", "dynamic loss scaling (ampcore.GradScaler)")
    require_white(amp_context, amp_dtype, ["linear"])
    reference = _train(amp_backend, amp_device, None)
    mixed = _train(amp_backend, amp_device, amp_dtype)
    assert all(map(lambda v: v == v and abs(v) != float("inf"), mixed)), "the mixed-precision loss went non-finite"
    ref_final, amp_final = sum(reference[-10:]) / 10, sum(mixed[-10:]) / 10
    assert amp_final < 0.25 * mixed[0], f"mixed precision did not learn: loss {mixed[0]:.4g} -> {amp_final:.4g}"
    allowed = ref_final * (1 + amp_tolerances.convergence_rtol) + 0.01 * reference[0]
    assert amp_final <= allowed, (
        f"final loss {amp_final:.4g} in {amp_dtype} vs {ref_final:.4g} in float32 (allowed {allowed:.4g}; "
        "widen [tolerances] convergence_rtol in the manifest only with a reason)"
    )
