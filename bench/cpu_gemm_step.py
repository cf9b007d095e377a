"""Issue 41's lead, at the step: transformers' Qwen2 (bench/memory.sh's Qwen2-0.5B-shaped model) at batch 4 x 512,
float32, 2 threads, AdamW, three steps, with every trained linear layer's products through MKL (`mkl`: as
shipped) or through oneDNN where bench/cpu_gemm.py found it faster (`onednn`: the forward and dX through
`torch.ops.mkldnn._linear_pointwise`; dW through it only when the layer's input is wider than its output, the
down projection, else MKL). Prints each step's seconds and loss.

  .venv/bin/python bench/cpu_gemm_step.py bench/out/memory/model-24-896-4864-151936 mkl
  .venv/bin/python bench/cpu_gemm_step.py bench/out/memory/model-24-896-4864-151936 onednn

Run it on a quiet machine (a step takes 80-95 s on the AVX2 host).
"""
import sys, time, json, torch, transformers
torch.set_num_threads(2)
mode = sys.argv[2]
assert mode in ("mkl", "onednn"), mode
lp = torch.ops.mkldnn._linear_pointwise
class DnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        x2 = x.reshape(-1, x.shape[-1])
        y = lp(x2, w, b, "none", [], "")
        return y.reshape(*x.shape[:-1], w.shape[0])
    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1]); x2 = x.reshape(-1, x.shape[-1])
        dx = lp(dy2, w.t(), None, "none", [], "").reshape(x.shape) if ctx.needs_input_grad[0] else None
        # oneDNN for dW only where the input is wider than the output (the down projection)
        if w.shape[1] > w.shape[0]:
            dw = lp(dy2.t(), x2.t(), None, "none", [], "")
        else:
            dw = dy2.t().mm(x2)
        db = dy2.sum(0) if ctx.needs_input_grad[2] else None
        return dx, dw, db
if mode == "onednn":
    orig = torch.nn.functional.linear
    def linear(x, w, b=None):
        if x.dtype == torch.float32 and w.requires_grad:
            return DnnLinear.apply(x, w, b)
        return orig(x, w, b)
    torch.nn.functional.linear = linear
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="float32", attn_implementation="sdpa")
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 151936, (4, 512), generator=g)
times, losses = [], []
for step in range(3):
    t = time.perf_counter()
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad()
    times.append(time.perf_counter() - t); losses.append(loss.item())
print(json.dumps({"mode": mode, "step_s": times, "losses": losses}))
