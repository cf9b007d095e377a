"""Issue 41's open lead: the float32 GEMMs of one Qwen2-0.5B block (and a 24th of the tied head) at
batch 4 x 512 = 2,048 tokens, through MKL (what `at::linear` and `mm` call on the CPU, ptrain and
transformers alike) against oneDNN's (`torch.ops.mkldnn._linear_pointwise`, the kernel inductor's CPU
code calls), for each of a linear layer's three products: forward `x @ W^T`, `dX = dY @ W`,
`dW = dY^T @ x`. The best of 4 interleaved calls each; 2 threads. TOKENS (default 2048) sets the rows: 512 is
batch 1 x 512.

  .venv/bin/python bench/cpu_gemm.py [TOKENS]

Run it on a quiet machine.
"""
import sys
import time

import torch

torch.set_num_threads(2)
onednn = torch.ops.mkldnn._linear_pointwise
M = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
# (in, out, how many per block): q and o, k and v, gate and up, down, and the tied head once per 24 blocks.
shapes = [(896, 896, 2), (896, 128, 2), (896, 4864, 2), (4864, 896, 1), (896, 151936, 1 / 24)]
total = {"mkl": 0.0, "onednn": 0.0}
for k, n, per_block in shapes:
    x, w, dy = torch.randn(M, k), torch.randn(n, k), torch.randn(M, n)
    pairs = [
        ("forward", lambda: torch.nn.functional.linear(x, w), lambda: onednn(x, w, None, "none", [], "")),
        ("dX", lambda: dy.mm(w), lambda: onednn(dy, w.t(), None, "none", [], "")),
        ("dW", lambda: dy.t().mm(x), lambda: onednn(dy.t(), x.t(), None, "none", [], "")),
    ]
    for what, mkl, dnn in pairs:
        best = {"mkl": 1e9, "onednn": 1e9}
        for _ in range(4):
            for name, f in (("mkl", mkl), ("onednn", dnn)):
                start = time.perf_counter()
                f()
                best[name] = min(best[name], time.perf_counter() - start)
        for name in best:
            total[name] += best[name] * per_block
        print(f"{k}->{n} {what}: mkl {best['mkl'] * 1000:.0f} ms, onednn {best['onednn'] * 1000:.0f} ms ({best['mkl'] / best['onednn']:.2f}x)", flush=True)
print(f"a block + a 24th of the head: mkl {total['mkl'] * 1000:.0f} ms, onednn {total['onednn'] * 1000:.0f} ms ({total['mkl'] / total['onednn']:.3f}x)")
