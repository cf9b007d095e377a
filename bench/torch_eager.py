"""Contender (d): the training in plain Python PyTorch, eager mode.

The loop a careful PyTorch user writes, doing what `ptrain run` does per step:
set the learning rate (warmup + cosine), zero the gradients, forward, cross
entropy, backward, clip the global gradient norm (foreach, on the device),
fused AdamW (`torch.optim.AdamW(fused=True)`, ptrain's groups and
hyper-parameters). The loss is read on the host every `run.log_every` steps
and at the last step; the held-out set is evaluated every `train.eval_every`
steps and at the last step. Batches are made inline from data generated at
set-up (see pycommon.py: same shapes and recipes as ptrain's, other random
numbers, so the losses differ from ptrain's).

The wall time runs from just before the first step (after the imports, the
data, the model and the optimizer are built) to the end of the last
evaluation, as ptrain's `wall_s`.

    .venv/bin/python bench/torch_eager.py --config bench/configs/mlp.toml --steps 1000 --out r.json
"""

import sys
import time

import torch

import pycommon as pc


def main():
    args = pc.common_args(__doc__.splitlines()[0]).parse_args()
    config, device = pc.resolve(args)
    data = pc.dataset(config, device)
    model = pc.model(config, data).to(device)
    model.train()
    optimizer = pc.adamw(model, config, device)
    params = [p for p in model.parameters() if p.requires_grad]

    total = config["train"]["steps"]
    accum = max(config["optim"]["accum_steps"], 1)
    clip = config["optim"]["grad_clip"]
    log_every = config["run"]["log_every"]
    eval_every = config["train"]["eval_every"]
    first_loss = last_loss = None
    evals = []

    started = time.perf_counter()
    for step in range(1, total + 1):
        lr = pc.lr_at(config, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        step_loss = None
        for _ in range(accum):
            x, y, _ = data.batch()
            with pc.autocast(config, device):
                logits = model(x)
            loss = pc.loss_fn(logits, y)
            if accum > 1:
                loss = loss / accum
            loss.backward()
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        optimizer.step()
        if first_loss is None:
            first_loss = step_loss
        if (eval_every > 0 and step % eval_every == 0) or step == total:
            evals.append((step, *pc.evaluate(model, data, config, device)))
        # The loss reaches the host only here, at ptrain's progress cadence.
        if log_every > 0 and (step % log_every == 0 or step == total):
            value = step_loss.item()
            if not args.quiet:
                print(f"step {step}/{total}  loss {value:.4f}  lr {lr:.2e}", file=sys.stderr)
        last_loss = step_loss
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall_s = time.perf_counter() - started

    result = {
        "contender": "torch eager",
        "steps": total,
        "wall_s": wall_s,
        "steps_per_s": total / wall_s,
        "first_loss": first_loss.item(),
        "final_loss": last_loss.item(),
        "final_eval_loss": evals[-1][1] if evals else None,
        "final_eval_accuracy": evals[-1][2] if evals else None,
        "eval_steps": [e[0] for e in evals],
        "threads": torch.get_num_threads(),
        "device": str(device),
        "optimizer": "torch.optim.AdamW(fused=True)",
        "parameters": sum(p.numel() for p in params),
    }
    pc.write_result(args.out, result)
    print(f"torch eager: {total} steps in {wall_s:.3f}s ({total / wall_s:.2f} steps/s); "
          f"loss {result['first_loss']:.4f} -> {result['final_loss']:.4f}, eval {result['final_eval_loss']:.4f}")


if __name__ == "__main__":
    main()
