"""level="auto" against fp32 and torch.autocast (issues 16 and 27).

Models (training steps: forward, MSE loss, backward, SGD):

* ``mixed``: 4 x ``Linear(1024)`` (ReLU between) on a batch of 512, plus 48 small residual
  ``Linear(64)`` layers (``y = y + tanh(linear(y))``: bounded, no overflow) on a batch of 16;
* ``heldout-mixed``: the same kind at the sizes of issue 27: 3 x ``Linear(1536)`` on a batch
  of 384 plus 40 small residual ``Linear(48)`` on a batch of 8 (``heldout-small``: its 40
  small layers alone, the part where auto can beat torch.autocast);
* ``heldout-wide``: other sizes of the same kind: 2 x ``Linear(1024)`` on a batch of 256 plus
  64 small residual ``Linear(96)`` on a batch of 4;
* ``heldout-conv``: three parts of other shapes: 2 x ``Conv2d(32, 32, 3)`` on 16 x 32 x 32
  images (ReLU between), 2 x ``Linear(1024)`` on a batch of 256, 24 small residual
  ``Linear(96)`` on a batch of 4;
* ``transformer``: a 4-layer ``nn.TransformerEncoder`` (d_model 256, 4 heads, feed-forward
  1024, dropout 0.1, batch_first) on batch 16 x 64 tokens;
* ``heldout-transformer``: 3 layers, d_model 320, 5 heads, feed-forward 1280, batch 16 x 64;
* ``heldout-mlp5``: 2 x ``Linear(2048)`` on a batch of 256 plus 56 small residual
  ``Linear(32)`` on a batch of 8 (fifth held-out sweep);
* ``heldout-decoder``: a 2-layer ``nn.TransformerDecoder`` (d_model 192, 6 heads,
  feed-forward 768, dropout 0.1) on 8 x 32 target tokens over an 8 x 48 memory;
* ``gpu-mixed``: for accelerators (``--device cuda``): 4 x ``Linear(4096)`` on a batch of
  4096 plus 64 small residual ``Linear(64)`` on a batch of 16 (small ones lose in low
  precision there: casts and launches);
* ``seed``: 9 x ``Linear(2048)`` on batch 512 (slow without bf16 hardware).

* ``heldout-flip``: the same 4 x ``Linear(256)`` on a batch of 16 and on a batch of 512
  (one module, two shape classes, decisions that differ by the batch);
* ``heldout-tie``: 6 x ``Linear(224)`` on a batch of 64 (low/fp32 near 1 with AMX);
* ``heldout-embed-mlp``: ``Embedding(16384, 384)`` on 32 x 64 tokens, 2 pre-norm MLP blocks
  (LayerNorm, ``Linear(384, 1536)``, GELU, ``Linear(1536, 384)``), LayerNorm, a head;
* ``heldout-attn``: ``Embedding(512, 192)`` on 8 x 48 tokens, 2 pre-norm blocks with
  ``MultiheadAttention`` (3 heads) and an MLP (768), LayerNorm, a head;
* ``heldout-tiny``: the same kind at d 32 (6 blocks, 2 heads, batch 4 x 8 tokens): small
  everything, float32's case.

Held-out kinds (issue 27, helper autoshapes; :mod:`auto_models` has each one's shapes):

* ``heldout-resnet``: a small ResNet-style CNN with ``BatchNorm2d`` (Conv + BN + ReLU,
  residual blocks, max pooling, a strided block with a 1 x 1 projection, a Linear head) on
  8 x 3 x 32 x 32 images;
* ``heldout-depthwise``: MobileNet-style depthwise (``groups=32``), pointwise and grouped
  (``groups=4``) convolutions with BatchNorm on 4 x 32 x 32 x 32;
* ``heldout-conv1d``: ``Conv1d`` over sequences (16 x 64 channels x 256 steps, a dilated one);
* ``heldout-lstm`` / ``heldout-gru``: a 2-layer ``nn.LSTM`` / ``nn.GRU`` (not a planned
  kind: its products run with the O1 lists) and a ``Linear`` head, 16 x 32 steps;
* ``heldout-functional``: ``torch.nn.functional.linear`` and ``torch.matmul`` on plain
  parameters in ``forward`` (ops outside planned modules), batch 64 x 256, one ``Linear``;
* ``heldout-vit``: a ViT-style patch embedding (``Conv2d(3, 128, 8, stride=8)``, 64
  patches), 2 pre-norm attention blocks, a head; batch 8;
* ``heldout-split``: big layers whose best is float32 (2 x ``Linear(1536)`` on a batch of 2:
  casting the weights costs more than bf16 saves) next to small ones whose best is low
  precision (2 x ``Linear(192)`` on a batch of 2048), a wide-and-shallow MLP at batch 2.

Held-out kinds of the sixth sweep (:mod:`auto_models6`): ``heldout-unet`` (a U-Net with
skip concatenations), ``heldout-lstm-lm`` (an LSTM language model with a tied head),
``heldout-bags`` (DLRM-like: ``EmbeddingBag`` and an MLP at batch 2048), ``heldout-bert``
(``transformers.BertModel`` from a config), ``heldout-strided`` (unpadded strided convolutions).
Of the seventh (:mod:`auto_models7`): ``heldout-replica`` (a transformer encoder replicated
every step as ``nn.DataParallel`` does), ``heldout-moe`` (a mixture of experts, top-2 of 8),
``heldout-llama`` (``transformers.LlamaModel`` from a config: RMSNorm, rotary, SwiGLU, GQA).
Of the eighth (:mod:`auto_models8`): ``heldout-scan`` (a Mamba/S4-like scan, a Python loop
over 64 steps), ``heldout-convnext`` (ConvNeXt blocks and shifted-window attention),
``heldout-clip`` (two towers called as two roots in one region).  Of the ninth
(:mod:`auto_models9`): ``heldout-diffusion`` (a diffusion U-Net: GroupNorm, timestep
embedding, attention), ``heldout-gat`` (graph attention: ``index_select``, ``scatter_add``),
``heldout-sdpa`` (a causal decoder on ``F.scaled_dot_product_attention``).  Of the fourteenth
stop (:mod:`auto_models14`: weights used more than once in one call): ``heldout-albert`` (one
shared block applied 6 times), ``heldout-cell`` (a recurrent cell stepped 64 times, a tied head).
Of the tenth sweep (:mod:`auto_models15`): ``heldout-switch`` (a Switch mixture of experts:
top-1 with a capacity, ``scatter`` / ``gather``, experts by ``torch.bmm``), ``heldout-selective``
(a Mamba-like selective scan), ``heldout-warp`` (a spatial transformer: ``F.affine_grid``).
Of the eleventh (:mod:`auto_models16_sweep`): ``heldout-film`` (a U-Net conditioned by FiLM:
``interpolate``, ``pixel_shuffle``), ``heldout-ntxent`` (NT-Xent over 512 x 512 logits),
``heldout-fno`` (a Fourier neural operator: ``rfft``, complex weights).  Of the twelfth
(:mod:`auto_models17_sweep`): ``heldout-moco`` (a momentum encoder updated in ``forward``),
``heldout-reentrant`` (``checkpoint(use_reentrant=True)`` blocks), ``heldout-normed``
(weight / spectral norm parametrizations inside ``parametrize.cached()``).
Hugging Face models (:mod:`auto_models16`, sixteenth stop; only where ``transformers`` is
installed): ``hf-bert`` (masked LM), ``hf-gpt2``, ``hf-t5``, ``hf-vit``, ``hf-llama``, each
trained on its own loss.

A model name may end in ``@ISA`` to run with ``ONEDNN_MAX_CPU_ISA=ISA`` (e.g.
``heldout-transformer@AVX512_CORE``: no bf16 instructions; ``@AVX512_CORE_BF16``: bf16 dot
products, no AMX; ``@AVX2`` also caps ATen's kernels and MKL's, :func:`isa_env`); without it
the CPU's own ISA.

Each model runs in its own processes (the ISA variable must be set before torch is
imported), with ``torch.set_flush_denormal(True)`` on the CPU: a *cold* process with an
empty disk cache (auto's first step measures the shape classes it meets), then a *warm*
process reading the cache the cold one wrote.  Every mode trains its own copy of the model
from the same initial weights; each round runs one step of every mode, the first
``--warmup`` rounds untimed, and more (up to ``--settle``) while auto's step of the round
still recorded or measured: on a cold cache auto's third step is its whole-call check
(hundreds of ms), which two warm-up rounds left in the first timed round (auto's median of
three GPU rounds was then the slower of its two other steps; :class:`auto_procs.Settling`).
Auto steps of the timed rounds that still record or measure (a class measured again a
second later, a re-check) are counted in the table's notes, with the median of the per-round
ratios of the other rounds.  The rounds cycle through orders of the modes in which each
mode follows each other mode equally often, across the rounds' boundaries too, and never
itself (:func:`orders`): a step pays for what the step before it left behind (caches, the
allocator's free lists), 2-12% after the float32 step on heldout-mixed, about 10% after
torch.autocast's emulated-bfloat16 step on heldout-clip without bf16 instructions; a
rotation of one order put torch.autocast after fp32 in two rounds of three and auto in one,
and the Williams design that followed (balanced inside rounds only) put auto after
torch.autocast 8 times in 15 rounds, float32 4 times (the steady 1-6% gap of a
float32-decided auto over float32 the fifteenth stop of issue 27 left unexplained).
``--noise`` adds torch.autocast again on its own copy of the model (what 1.00 looks like in
that process); ``--forced`` adds auto on two more copies
whose whole-call verdict is forced to ``low`` and to ``plan`` (what each program costs in
steps, whatever the check said).  ``--malloc steady`` runs the processes with glibc's allocator told
to keep freed memory (``GLIBC_TUNABLES`` mmap and trim thresholds): with the default, each
step of heldout-mixed returns 16-32 MB to the system and faults it back (4000-8000 minor
page faults per step, a number that differs between processes and modes); the tables show
the faults per step.  Outside its regions auto registers no module hook,
so fp32 and torch.autocast pay nothing for it.  The tables give medians of the timed rounds
and the ratios of those medians, all within one process; the check line compares the median
of the per-round ratios auto / min(fp32, torch.autocast) (paired: drift within a process hits
the three modes of a round alike) with the target of issue 27 (<= 1.03).

    python benchmarks/bench_auto.py                                   # mixed + transformer
    python benchmarks/bench_auto.py --models heldout-mixed heldout-transformer@AVX512_CORE \\
        heldout-transformer --rounds 7
    python benchmarks/bench_auto.py --device cuda --models gpu-mixed --rounds 5   # ~60-90 s
    python benchmarks/bench_auto.py --region-cost     # auto region enter/exit, calls after it
    python benchmarks/bench_auto.py --models heldout-small --pairs 300   # auto vs fp32 step pairs
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, Final

from auto_micro import pairs, region_cost
from auto_models import build
from auto_models import loss as loss_of
from auto_procs import ISA_VARIABLES, STEADY_MALLOC, Settling, corrupt, isa_env, orders

MODES: Final = ("fp32", "torch.autocast", "auto")
#: ``--noise``: torch.autocast again on its own copy of the model (what 1.00 looks like here)
AGAIN: Final = "torch.autocast again"
#: ``--forced``: auto on its own copies with the whole-call verdict forced (not measured)
FORCED: Final = {"auto as low": "low", "auto as plan": "plan"}


def child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one model's modes in this process; return the measurements."""
    import torch

    import ampcore
    from ampcore._auto import _hooks
    from ampcore._backends.memory import synchronize
    from ampcore._backends.registry import resolve_device

    backend = resolve_device(args.device).backend
    device_type = backend.device_type
    if args.clock == "cpu" and device_type != "cpu":
        raise SystemExit("--clock cpu times this process's CPU time: for --device cpu only")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if device_type == "cpu":
        torch.set_flush_denormal(True)
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base, data = build(name, device_type)
    dtype = backend.check_dtype(None)
    auto_region = ampcore.autocast(args.device, level="auto")
    regions: dict[str, Callable[[], Any]] = {
        "fp32": lambda: torch.autocast(device_type, enabled=False),
        "torch.autocast": lambda: torch.autocast(device_type, dtype=dtype),
        "auto": lambda: auto_region,
    }
    modes = (*MODES, AGAIN) if args.noise else MODES
    regions[AGAIN] = regions["torch.autocast"]
    if args.forced:
        modes = (*modes, *FORCED)
        regions.update(dict.fromkeys(FORCED, regions["auto"]))
    rounds = orders(modes)
    models = {mode: copy.deepcopy(base) for mode in modes}
    if args.forced:
        _force({id(models[mode]): verdict for mode, verdict in FORCED.items()})
    opts = {mode: torch.optim.SGD(models[mode].parameters(), lr=1e-4) for mode in modes}
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    faults: dict[str, list[int]] = {mode: [] for mode in modes}
    losses: dict[str, float] = {}
    first_auto_ms = None
    settling, warmup, round_ = Settling(), args.warmup, 0
    settled_timed: list[float] = []  # timed auto steps that still recorded or measured (ms)
    busy_rounds: list[int] = []  # the timed rounds with such a step (their index among the timed rounds)
    while round_ < warmup + args.rounds:
        busy, steps = False, []
        for mode in rounds[(round_ - args.warmup) % len(rounds)]:
            synchronize(backend)
            settling.start()
            flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = clock()
            with regions[mode]():
                out = models[mode](*data)
                loss = loss_of(out, data)
            loss.backward()
            opts[mode].step()
            opts[mode].zero_grad(set_to_none=True)
            synchronize(backend)
            elapsed = (clock() - start) * 1e3
            settled = regions[mode] is regions["auto"] and settling.step()  # (the forced copies too)
            busy = busy or settled
            losses[mode] = float(loss)
            if mode == "auto" and first_auto_ms is None:
                first_auto_ms = elapsed
            else:
                steps.append((mode, elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt, settled))
        if round_ == warmup and busy and warmup < args.warmup + args.settle:
            warmup += 1  # auto still settling (its whole-call check, a recording): this round untimed too
        elif round_ >= warmup:
            if busy:
                busy_rounds.append(round_ - warmup)
            for mode, elapsed, fault, settled in steps:
                times[mode].append(elapsed)
                faults[mode].append(fault)
                if settled:
                    settled_timed.append(elapsed)
        round_ += 1
    plan = ampcore.auto_plan(args.device)
    return {
        "model": name,
        "median_ms": {mode: statistics.median(t) for mode, t in times.items()},
        "times": times,
        "faults": {mode: statistics.median(f) for mode, f in faults.items()},
        "losses": losses,
        "first_auto_ms": first_auto_ms,
        "warmup_rounds": warmup,
        "settled_timed": settled_timed,
        "busy_rounds": busy_rounds,
        "measure_s": _hooks._process.spent_s,
        "hooks_left": _hooks.installed(),
        "decisions": {key: e.decision for key, e in plan.entries.items()},
        "roots": {
            key: [c.verdict, c.plan_over_low, c.plan_over_fp32, c.spread, c.runs, c.source]
            + [c.load, c.checks, c.provisional]
            for key, c in plan.roots.items()
        },
        "sources": sorted({e.source for e in plan.entries.values()}),
        "table": plan.table(),
        "threads": torch.get_num_threads(),
        "device": backend.device_name(0),
    }


def _force(verdicts: dict[int, str]) -> None:
    """``--forced``: the roots with these ids run their program as the verdict says (``low``:
    torch.autocast's program, ``plan``: the mixed one) instead of the whole-call check's
    (measured for the ``auto`` copy): what each costs in steps, next to what the check says."""
    from ampcore._auto import _roots, _store

    settle = _roots.settle

    def forced(root: Any, args: Any, kwargs: Any, program: Any, region: Any, plan: Any, sig: Any, clock: Any) -> Any:
        verdict = verdicts.get(id(root))
        if verdict is None:
            return settle(root, args, kwargs, program, region, plan, sig, clock)
        chosen = program.fixed(verdict)
        _store.store(root, sig, chosen)
        return chosen

    _roots.settle = forced


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mixed", "transformer@AVX512_CORE"])
    parser.add_argument("--device", default="cpu", help="the ampcore backend to run on (default cpu)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed rounds at least (2: auto's new root, then its recording)"
    )
    parser.add_argument(
        "--settle",
        type=int,
        default=4,
        help="untimed rounds added at most while auto's step still records or measures (its whole-call "
        "check: auto's third step; 0: --warmup rounds only, as before issue 27's seventeenth stop)",
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1: stable on a shared machine)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU time per step (page faults included, time waiting for a core not)",
    )
    parser.add_argument(
        "--malloc", choices=("default", "steady"), default="default", help="steady: glibc keeps freed memory"
    )
    parser.add_argument(
        "--cache",
        choices=("cold", "warm", "both", "corrupt"),
        default="both",
        help="which processes to time (corrupt: a warm one after the cold one's cache was poisoned, see corrupt())",
    )
    parser.add_argument("--tables", action="store_true", help="print auto's plan table of each process")
    parser.add_argument("--noise", action="store_true", help=f"add the mode {AGAIN!r}: its own copy, torch.autocast")
    parser.add_argument(
        "--forced", action="store_true", help=f"add the modes {', '.join(map(repr, FORCED))}: see _force"
    )
    parser.add_argument("--region-cost", action="store_true", help="only time region enter/exit (see region_cost)")
    parser.add_argument("--pairs", type=int, default=0, help="only auto vs fp32 step pairs (see pairs)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the measurements as JSON")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    malloc = f"GLIBC_TUNABLES={STEADY_MALLOC}" if args.malloc == "steady" else "default allocator"
    print(f"load average at start: {_load()} ({os.cpu_count()} CPUs); device {args.device}; {malloc}")
    if args.pairs or args.region_cost:
        with tempfile.TemporaryDirectory(prefix="ampcore-auto-cache-") as cache:
            os.environ["AMPCORE_AUTO_CACHE"] = cache  # auto's plan measured here, not the user's cache
            for spec in args.models if args.pairs else ():
                pairs(spec, args.pairs)
            if args.region_cost:
                region_cost()
        print(f"load average at end: {_load()}")
        return
    results = []
    for spec in args.models:
        name, _, isa = spec.partition("@")
        with tempfile.TemporaryDirectory(prefix="ampcore-auto-cache-") as cache:
            for phase in ("cold", "warm"):
                if phase == "warm" and args.cache == "corrupt":
                    print(f"\ncorrupted: {corrupt(cache)}")
                    phase = "corrupt"
                result = _run(name, isa, phase, cache, args)
                if args.cache in (phase, "both"):
                    results.append(result)
                    _print(result, args.tables)
    print(f"\nload average at end: {_load()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _run(name: str, isa: str, phase: str, cache: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "AMPCORE_AUTO_CACHE": cache}
    for variable in ISA_VARIABLES:
        env.pop(variable, None)
    env.update(isa_env(isa))
    if args.malloc == "steady":
        env["GLIBC_TUNABLES"] = STEADY_MALLOC
    rounds = args.rounds if args.cache in (phase, "both") else 1  # a cold run only to fill the cache
    cmd = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--device",
        args.device,
        "--rounds",
        str(rounds),
        "--warmup",
        str(args.warmup),
        "--settle",
        str(args.settle),
        "--threads",
        str(args.threads),
        "--clock",
        args.clock,
        *(["--noise"] if args.noise else []),
        *(["--forced"] if args.forced else []),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{name} ({phase}) failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(isa=isa, phase=phase)
    return result


def _print(r: dict[str, Any], tables: bool) -> None:
    med = r["median_ms"]
    isa = "".join(f", {k}={v}" for k, v in isa_env(r["isa"]).items())
    low = sum(1 for d in r["decisions"].values() if d == "low")
    print(
        f"\n{r['model']}{isa}, {r['phase']} cache, {r['device']} ({r['threads']} threads), "
        f"median of {len(r['times']['fp32'])} interleaved rounds"
    )
    print(f"{'mode':<16}{'ms/step':>10}{'/ fp32':>9}{'/ torch.autocast':>18}{'final loss':>12}{'faults':>8}")
    for mode in r["times"]:
        print(
            f"{mode:<16}{med[mode]:>10.1f}{med[mode] / med['fp32']:>9.2f}"
            f"{med[mode] / med['torch.autocast']:>18.2f}{r['losses'][mode]:>12.5f}{r['faults'][mode]:>8.0f}"
        )
    best = min(med["fp32"], med["torch.autocast"])
    t = r["times"]
    paired = statistics.median(a / min(f, c) for a, f, c in zip(t["auto"], t["fp32"], t["torch.autocast"], strict=True))
    verdict = "ok" if paired <= 1.03 else "OVER"
    print(
        f"auto / min(fp32, torch.autocast) = {med['auto'] / best:.2f} (ratio of medians); "
        f"median of per-round ratios {paired:.3f} ({verdict}; target <= 1.03)"
    )
    if AGAIN in t:
        again = statistics.median(a / c for a, c in zip(t[AGAIN], t["torch.autocast"], strict=True))
        print(f"noise: {AGAIN} / torch.autocast, median of per-round ratios {again:.3f} (the same work twice)")
    for mode in (m for m in FORCED if m in t):
        ratio = statistics.median(a / c for a, c in zip(t[mode], t["torch.autocast"], strict=True))
        print(f"forced: {mode} / torch.autocast, median of per-round ratios {ratio:.3f}")
    print(
        f"auto: first step {r['first_auto_ms']:.0f} ms (measuring {r['measure_s']:.1f} s); "
        f"{len(r['decisions'])} shape classes ({', '.join(r['sources']) or '-'}), {low} low precision, "
        f"{len(r['decisions']) - low} float32; hooks left after the regions: {r['hooks_left']}"
    )
    late, busy = r["settled_timed"], set(r["busy_rounds"])
    rounds = enumerate(zip(t["auto"], t["fp32"], t["torch.autocast"], strict=True))
    quiet = [a / min(f, c) for i, (a, f, c) in rounds if i not in busy]
    settled = f"; the {len(quiet)} other rounds: {statistics.median(quiet):.3f}" if busy and quiet else ""
    print(
        f"auto: {r['warmup_rounds']} untimed rounds (settled); timed auto steps that recorded or measured: "
        f"{len(late)}{''.join(f', {ms:.0f} ms' for ms in late)}{settled}"
    )
    for key, (verdict, over_low, over_fp32, spread, runs, source, load, checks, again) in r["roots"].items():
        state = f"load {'-' if load is None else f'{load:.2f}'}, check {checks}{' provisional' if again else ''}"
        print(
            f"whole-call check ({source}): {key}: program / low {over_low:.3f}, / fp32 {over_fp32:.3f}, "
            f"spread {spread:.3f}, {runs} rounds, {state} -> runs as {verdict}"
        )
    if tables:
        print(r["table"])


if __name__ == "__main__":
    main()
