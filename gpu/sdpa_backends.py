"""Which scaled-dot-product-attention kernel takes ptrain's packed-row mask on this GPU.

ptrain's packed rows (data.packing) reach SDPA as a [B, 1, T, T] boolean mask
(core/src/model/attention.rs: same row and causal). FlashAttention takes no mask,
so such a call goes to the memory-efficient kernel or to the math fallback. This
probe builds the same mask for a Qwen2-0.5B-shaped attention (14 heads of 64, T = 2048,
rows of mixed lengths; 14 KV heads, and 2 with enable_gqa as ptrain's llama calls it), runs it under each backend alone,
and times each against the plain causal call that unpacked rows make. One JSON
object on stdout.

    python3 gpu/sdpa_backends.py [--t 2048] [--batch 4]
"""

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def packed_mask(batch, t, device, gen):
    ids = torch.zeros(batch, t, dtype=torch.long)
    for b in range(batch):
        at, row = 0, 1
        while at < t:
            n = int(torch.randint(32, 512, (1,), generator=gen))
            ids[b, at:at + n] = row
            at, row = at + n, row + 1
    ids = ids.to(device)
    same = ids.unsqueeze(2) == ids.unsqueeze(1)
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    return (same & causal).unsqueeze(1), ids


def timed(fn, repeats=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--t", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    a = p.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    h, d = 14, 64
    q, k, v = (torch.randn(a.batch, h, a.t, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    # ptrain's llama call: 2 KV heads, enable_gqa (the KV heads are not repeated first).
    kg, vg = (torch.randn(a.batch, 2, a.t, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    mask, _ = packed_mask(a.batch, a.t, dev, gen)
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "shape": [a.batch, h, a.t, d],
           "dtype": "bf16", "mask": "[B,1,T,T] bool, packed rows + causal", "backends": {}}
    ref = None
    for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]:
        for case, kw in [("packed mask", dict(attn_mask=mask)), ("causal", dict(is_causal=True)),
                         ("packed mask, gqa", dict(attn_mask=mask, enable_gqa=True)),
                         ("causal, gqa", dict(is_causal=True, enable_gqa=True))]:
            key = f"{name}, {case}"
            kk, vv = (kg, vg) if "gqa" in case else (k, v)
            try:
                with sdpa_kernel([be]):
                    y = F.scaled_dot_product_attention(q, kk, vv, **kw)

                    def step():
                        F.scaled_dot_product_attention(q, kk, vv, **kw).sum().backward()
                    ms = timed(step)
                r = {"runs": True, "fwd_bwd_ms": round(ms, 3)}
                if case == "packed mask":
                    if ref is None:
                        ref = y.float()
                    r["max_diff_to_first"] = float((y.float() - ref).abs().max())
            except RuntimeError as e:
                r = {"runs": False, "why": str(e).strip().splitlines()[0][:200]}
            out["backends"][key] = r
    # What the default dispatch picks for the packed mask: the kernel names it launches.
    for case, (kk, vv, gqa) in {"default_packed_kernels": (k, v, False), "default_packed_gqa_kernels": (kg, vg, True)}.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=gqa)
            torch.cuda.synchronize()
        out[case] = sorted({e.key for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0})[:8]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
