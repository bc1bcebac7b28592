import sys, torch
sys.path.insert(0, 'lab/scripts')
from kernel_bandwidth import SHAPES, gbps
from selfspec._engine.runner import native, native_madd
from selfspec._engine.runner.panels import to_madd_panels, to_panels
from selfspec.app._bench.roofline import read_bandwidths
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
raw = [(torch.randn(o, i, generator=g) * 0.02) for _ in range(4) for (o, i) in SHAPES]
qs = [(w / w.abs().amax(1, keepdim=True) * 127).round().to(torch.int8) for w in raw]
nbytes = sum(q.numel() for q in qs)
tq = native.tile_q()
p8 = [to_panels(q, tq, torch.int8) for q in qs]
pm = [to_madd_panels(q) for q in qs]
s8 = [torch.ones(p.shape[0] * tq) for p in p8]
sm = [torch.ones(p.shape[0] * 16) for p in pm]
print({k: round(v / 1e9, 1) for k, v in read_bandwidths().items()})
for rows in [1, 2, 3, 4, 6, 8, 1]:
    xs = {i: torch.randn(rows, i) for i in {i for _, i in SHAPES}}
    f8 = lambda: [native.native_linear_int8(xs[q.shape[1]], p, s, None, q.shape[0]) for q, p, s in zip(qs, p8, s8)]
    fm = lambda: [native_madd.native_linear_i8madd(xs[q.shape[1]], p, s, None, q.shape[0]) for q, p, s in zip(qs, pm, sm)]
    a, b = gbps(f8, nbytes, 9), gbps(fm, nbytes, 9)
    print(f"rows {rows}: int8native {nbytes/a/1e6:.1f} ms ({a:.1f} GB/s)  int8madd {nbytes/b/1e6:.1f} ms ({b:.1f} GB/s)", flush=True)
