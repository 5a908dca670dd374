"""The one-off cost of a whole-call check's key (``ampcore._auto._verify.root_key``) on
BERT-base (``transformers.BertModel``, 12 layers, random weights: nothing downloaded), and,
where the code has them (issue 27, twelfth stop), what a root's watched flags cost (the
flags of planned layers of classes judged per flags: none on BERT-base): taken at a
recording's start (``_settings.before``) and compared on every root call (``Settings.same``).

Run it against two versions in separate processes (``PYTHONPATH=<worktree>``) to compare:

    python benchmarks/bench_auto_key.py --repeats 50
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch


def _time_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median and minimum over ``repeats`` calls (ms)."""
    found = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        found.append((time.perf_counter() - start) * 1e3)
    return statistics.median(found), min(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    import transformers

    from ampcore._auto._program import Program
    from ampcore._auto._verify import root_key

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig())
    sig = (True, (torch.Size([8, 128]), torch.int64, torch.device("cpu")))
    program = Program(None, 0, False, ())  # type: ignore[arg-type]
    modules = list(model.modules())
    med, low = _time_ms(lambda: root_key(model, sig, program), args.repeats)
    print(f"modules {len(modules)}  root_key: median {med:.3f} ms, min {low:.3f} ms")
    try:
        from ampcore._auto import _settings
    except ImportError:
        print("no _settings module (before the twelfth stop)")
        return
    med, low = _time_ms(lambda: _settings.before(modules), args.repeats)
    print(f"settings.before (a recording's start): median {med:.3f} ms, min {low:.3f} ms")
    watched = _settings.watch(modules, _settings.before(modules))
    if watched is None:
        print("no watched settings")
        return
    settings, values = watched
    calls = 10000
    start = time.perf_counter()
    for _ in range(calls):
        settings.same(values)
    per_call = (time.perf_counter() - start) / calls * 1e6
    owners = len(set(map(id, settings.dicts)))
    print(f"watched settings {len(values)} on {owners} modules: {per_call:.2f} us a root call")


if __name__ == "__main__":
    main()
