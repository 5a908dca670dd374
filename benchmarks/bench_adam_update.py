"""The AdamW update alone, O2 chunked vs torch's AdamW on fp32 and on bf16 parameters (issue 17).

9 x Linear(2048) parameters with random gradients; each round runs one ``optimizer.step()``
of every setup (O2 once per chunk size given), interleaved; prints the median (ms) of the
rounds after the first, and the load average.

    python benchmarks/bench_adam_update.py THREADS [CHUNK ...]
    python benchmarks/bench_adam_update.py 1 262144 1048576
"""
import time, statistics, torch, sys, warnings, os
warnings.simplefilter("ignore")
import ampcore, ampcore._o2.master_adam as ma
from ampcore._cli.experiment import SeedNet
torch.set_flush_denormal(True)
torch.set_num_threads(int(sys.argv[1]))
def mk(kind):
    torch.manual_seed(0); m = SeedNet(2048)
    if kind == "bf16": m.to(torch.bfloat16)
    o = torch.optim.AdamW(m.parameters(), lr=1e-4)
    if kind == "fast": m, o = ampcore.decorate(m, o, level="O2", device="cpu")
    gs = [torch.randn_like(p) for p in m.parameters()]
    return m, o, gs
setups = {k: mk(k) for k in ("fp32", "bf16", "fast")}
chunks = [int(c) for c in sys.argv[2:]]
times = {}
for r in range(5):
    for k,(m,o,gs) in setups.items():
        for c in (chunks if k == "fast" else [0]):
            ma.ADAM_CHUNK = c or ma.ADAM_CHUNK
            for p, g in zip(m.parameters(), gs): p.grad = g
            t=time.perf_counter(); o.step(); times.setdefault(f"{k}{c or ''}", []).append(time.perf_counter()-t)
print(sys.argv[1], "threads", {k: round(statistics.median(v[1:])*1e3,1) for k,v in times.items()}, os.getloadavg())
