"""The Python side of bench/memory.sh: the model, and the transformers contenders.

  memory.py make DIR LAYERS WIDTH VOCAB POSITIONS [INTERMEDIATE]
        a random Qwen2 (LAYERS decoder layers of WIDTH, heads of 64, 2 KV heads, intermediate
        INTERMEDIATE or 2.75 x WIDTH, tied head, VOCAB ids), saved with save_pretrained for both
        sides to load
  memory.py hf DIR STEPS BATCH SEQ THREADS [--gc] [--lora RANK] [--onednn]
        a plain loop on transformers' Qwen2ForCausalLM (float32, SDPA): random ids, labels = ids,
        AdamW on what requires grad; --gc calls activation_checkpointing_enable() (gradient_checkpointing_enable() before transformers 5), --lora wraps the
        model with peft LoRA (RANK, alpha 2 x RANK, the seven projections); --onednn runs the trained
        linear layers' products through oneDNN where bench/cpu_gemm.py found it faster (issue 41's lead).
        Prints JSON: steps/s (every step, as ptrain's summary.json), each step's seconds, the last loss,
        trainable parameters and the peak RSS.
"""
import json
import resource
import sys
import time


def out(obj):
    obj["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(obj))


def make(d, layers, width, vocab, positions, intermediate=None):
    import torch
    import transformers

    config = transformers.Qwen2Config(vocab_size=int(vocab), hidden_size=int(width), intermediate_size=int(intermediate or int(width) * 11 // 4),
                                      num_hidden_layers=int(layers), num_attention_heads=int(width) // 64, num_key_value_heads=2,
                                      max_position_embeddings=int(positions), tie_word_embeddings=True, bos_token_id=None,
                                      eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(d)
    out({"parameters": sum(p.numel() for p in model.parameters())})


def hf(d, steps, batch, seq, threads, *flags):
    import torch
    import transformers

    torch.set_num_threads(int(threads))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype="float32", attn_implementation="sdpa")
    if "--gc" in flags:
        # transformers 5 renamed gradient_checkpointing_enable (kept as a deprecated alias).
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        model.config.use_cache = False
    if "--onednn" in flags:
        route_linears_through_onednn()
    if "--lora" in flags:
        model = peft_lora(model, int(flags[flags.index("--lora") + 1]))
        if "--gc" in flags:
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    vocab = model.config.vocab_size
    loss = None
    started = time.perf_counter()
    step_s = []
    for _ in range(int(steps)):
        step_started = time.perf_counter()
        ids = torch.randint(0, vocab, (int(batch), int(seq)))
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_s.append(time.perf_counter() - step_started)
    # Over every step, the first included, and nothing else: bench/qwen05b_pairs.sh times ptrain's steps the same way.
    out({"steps_per_s": int(steps) / (time.perf_counter() - started), "step_s": step_s, "last_loss": loss.item(), "trainable": sum(p.numel() for p in params)})


def peft_lora(model, rank):
    """`model` wrapped with peft LoRA: RANK, alpha 2 x RANK, no dropout, the seven projections."""
    import peft

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets))


def route_linears_through_onednn():
    """Every float32 linear layer with a trained weight computes its forward and dX through oneDNN
    (`torch.ops.mkldnn._linear_pointwise`), and dW through it only where the input is wider than the
    output (the down projection), MKL otherwise: the faster kernel per product in bench/cpu_gemm.py."""
    import torch

    onednn = torch.ops.mkldnn._linear_pointwise

    class OneDnnLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.save_for_backward(x, w)
            return onednn(x.reshape(-1, x.shape[-1]), w, b, "none", [], "").reshape(*x.shape[:-1], w.shape[0])

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
            dx = onednn(dy2, w.t(), None, "none", [], "").reshape(x.shape) if ctx.needs_input_grad[0] else None
            dw = onednn(dy2.t(), x2.t(), None, "none", [], "") if w.shape[1] > w.shape[0] else dy2.t().mm(x2)
            db = dy2.sum(0) if ctx.needs_input_grad[2] else None
            return dx, dw, db

    plain = torch.nn.functional.linear

    def linear(x, w, b=None):
        if x.dtype == torch.float32 and w.requires_grad:
            return OneDnnLinear.apply(x, w, b)
        return plain(x, w, b)

    torch.nn.functional.linear = linear


if __name__ == "__main__":
    {"make": make, "hf": hf}[sys.argv[1]](*sys.argv[2:])
