"""The process-level helpers of ``bench_auto.py``: the orders of the modes in rounds, the
glibc setting of ``--malloc steady``, the ISA caps of ``model@ISA``, the poisoning of
``--cache corrupt`` and the auto steps that still settle (:class:`Settling`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final


def orders(modes: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Orders of ``modes`` for successive rounds, run in a cycle, in which each mode follows
    each other mode equally often *across the rounds' boundaries too* and never itself
    (``ampcore._auto._orders``: ``n - 1`` orders, the whole-call check's too).

    A step pays for what the step before it left behind (caches, the allocator's free lists):
    on heldout-clip without bf16 instructions a float32 step right after torch.autocast's
    emulated-bfloat16 step takes about 10% longer.  The Williams design used before balanced
    the neighbours inside rounds only: over 15 rounds of three modes auto followed
    torch.autocast 8 times, float32 4 times (the steady 1-6% gap of a float32-decided auto
    over float32 there was the order's; docs/performance.md, issue 27, sixteenth stop).

    Example::

        >>> orders(("a", "b", "c"))
        [('a', 'b', 'c'), ('a', 'c', 'b')]
    """
    from ampcore._auto._orders import orders as balanced

    return balanced(modes)


#: glibc's allocator keeps freed memory: no page faults per step (``--malloc steady``)
STEADY_MALLOC: Final = "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824"


def corrupt(cache: str) -> str:
    """Poison the cache files in ``cache`` as issue 27 saw it: every other entry's low-precision
    figure times 8.6 (a first call that paid kernel creation), one entry's costs not numbers,
    and every whole-call verdict swapped for another; what was done."""
    done = []
    for path in sorted(Path(cache).glob("auto-*.json")):
        data = json.loads(path.read_text())
        for i, (key, entry) in enumerate(sorted(data["entries"].items())):
            if i == 0:
                entry["costs"]["fp32_ms"] = "fast"
                done.append(f"{key}: fp32_ms='fast'")
            elif i % 2 == 1:
                entry["costs"]["low_ms"] *= 8.6
                done.append(f"{key}: low_ms x 8.6")
        for key, check in data.get("roots", {}).items():
            check["verdict"] = {"plan": "low", "low": "fp32", "fp32": "plan"}[check["verdict"]]
            done.append(f"{key}: verdict -> {check['verdict']}")
        path.write_text(json.dumps(data))
    return "; ".join(done) or "nothing (no cache file)"


#: what ``model@ISA`` sets (:func:`isa_env`); unset for the CPU's own ISA
ISA_VARIABLES: Final = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def isa_env(isa: str) -> dict[str, str]:
    """The variables that cap the CPU's instruction sets at ``isa`` (oneDNN's name): oneDNN's
    own cap, and for ``AVX2`` also ATen's vectorised kernels and MKL's (its float32 GEMMs),
    which otherwise keep using AVX512.

    Example::

        >>> isa_env("AVX2")["ATEN_CPU_CAPABILITY"], isa_env("AVX512_CORE"), isa_env("")
        ('avx2', {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE'}, {})
    """
    if not isa:
        return {}
    env = {"ONEDNN_MAX_CPU_ISA": isa}
    if isa.upper() == "AVX2":
        env.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2")
    return env


class Settling:
    """Whether an auto step *settled* anything: recorded a root call (``_roots._record``: a
    new root applied call by call, a recording, one to measure a class again) or measured
    (classes or a whole-call check: the process's measuring seconds grew).

    auto's first steps on a cold cache are: the new root's call, applied call by call while
    its classes are measured; the recording of its program; the program's whole-call check
    (hundreds of ms) where it applies; only then the settled step.  ``bench_auto.py``'s two
    warm-up rounds covered the first two: the check was the first *timed* auto step, one of
    three rounds on the GPU (``--rounds 3``), so auto's median was the slower of its two
    other steps (issue 27, seventeenth stop).  Its warm-up now goes on while auto's step of
    the round settled (:meth:`step`), up to ``--settle`` rounds more."""

    def __init__(self) -> None:
        from ampcore._auto import _hooks, _roots

        self.hooks, self.recorded = _hooks, 0
        record = _roots._record

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.recorded += 1
            return record(*args, **kwargs)

        _roots._record = counted  # (read through the module by the sentinel and new roots)
        self.before = (0, 0.0)

    def start(self) -> None:
        """Before a step of an auto mode."""
        self.before = (self.recorded, self.hooks._process.spent_s)

    def step(self) -> bool:
        """After it: whether it recorded or measured."""
        return (self.recorded, self.hooks._process.spent_s) != self.before
