"""The seeds' monitoring, written out in Python: the eager loop of torch_eager.py
plus, every step, what seed 002's `ModelHealthMonitor` computes (gradient norm,
parameter norm, weight-update ratio, a gradient-anomaly check, each read on the
host) and, every 50 steps, seed 000's PyTorch profiler measurement of one step
(`torch.profiler.profile(record_shapes=True, with_flops=True)` and the FLOPs
summed from its events). The comparison for the `health` and `trace` plugins in
bench/health_trace.py.

    .venv/bin/python bench/seeds_monitor.py --config bench/configs/mlp.toml --steps 1000 --out r.json
    .venv/bin/python bench/seeds_monitor.py ... --no-monitor     # the same loop without the monitoring
"""

import statistics
import sys
import time

import torch

import pycommon as pc

PROFILE_EVERY = 50
ANOMALY_WINDOW = 100


class ModelHealthMonitor:
    """What seed 002's monitor does each step, as it did it: per-parameter norms
    read with `.item()`, a copy of the parameters before the update."""

    def __init__(self, params):
        self.params = params
        self.history = []
        self.anomalies = 0
        self.before = None

    def gradient_norm(self):
        return sum(p.grad.norm(2).item() ** 2 for p in self.params if p.grad is not None) ** 0.5

    def parameter_norm(self):
        return sum(p.norm(2).item() ** 2 for p in self.params) ** 0.5

    def before_update(self):
        self.before = [p.detach().clone() for p in self.params]

    def update_ratio(self):
        num = sum((p.detach() - b).norm(2).item() ** 2 for p, b in zip(self.params, self.before)) ** 0.5
        den = sum(b.norm(2).item() ** 2 for b in self.before) ** 0.5
        return num / max(den, 1e-12)

    def detect_gradient_anomaly(self, norm):
        anomaly = False
        if len(self.history) >= 10:
            mean, sd = statistics.fmean(self.history), statistics.pstdev(self.history)
            anomaly = norm > mean + 3 * sd
        self.history = (self.history + [norm])[-ANOMALY_WINDOW:]
        self.anomalies += anomaly
        return anomaly


def profiled_flops(prof):
    return sum(e.flops for e in prof.events() if e.flops)


def main():
    parser = pc.common_args(__doc__.splitlines()[0])
    parser.add_argument("--no-monitor", action="store_true", help="the plain loop (the reference)")
    args = parser.parse_args()
    config, device = pc.resolve(args)
    data = pc.dataset(config, device)
    model = pc.model(config, data).to(device)
    model.train()
    optimizer = pc.adamw(model, config, device)
    params = [p for p in model.parameters() if p.requires_grad]
    monitor = None if args.no_monitor else ModelHealthMonitor(params)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    total = config["train"]["steps"]
    clip = config["optim"]["grad_clip"]
    log_every = config["run"]["log_every"]
    first_loss = last_loss = None
    flops = None

    def step_body(step):
        lr = pc.lr_at(config, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        x, y, _ = data.batch()
        with pc.autocast(config, device):
            logits = model(x)
        loss = pc.loss_fn(logits, y)
        loss.backward()
        if monitor:
            monitor.detect_gradient_anomaly(monitor.gradient_norm())
            monitor.parameter_norm()
            monitor.before_update()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        optimizer.step()
        if monitor:
            monitor.update_ratio()
        return loss.detach(), lr

    started = time.perf_counter()
    for step in range(1, total + 1):
        if monitor and (step == 1 or step % PROFILE_EVERY == 0):
            with torch.profiler.profile(activities=activities, record_shapes=True, with_flops=True) as prof:
                step_loss, lr = step_body(step)
            flops = profiled_flops(prof)
        else:
            step_loss, lr = step_body(step)
        if first_loss is None:
            first_loss = step_loss
        if log_every > 0 and (step % log_every == 0 or step == total):
            value = step_loss.item()
            if not args.quiet:
                print(f"step {step}/{total}  loss {value:.4f}  lr {lr:.2e}", file=sys.stderr)
        last_loss = step_loss
    evals = [(total, *pc.evaluate(model, data, config, device))]
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall_s = time.perf_counter() - started

    result = {
        "contender": "seeds' monitoring" if monitor else "torch eager",
        "steps": total,
        "wall_s": wall_s,
        "steps_per_s": total / wall_s,
        "first_loss": first_loss.item(),
        "final_loss": last_loss.item(),
        "final_eval_loss": evals[-1][1],
        "anomalies": monitor.anomalies if monitor else None,
        "profiled_flops": flops,
        "threads": torch.get_num_threads(),
        "device": str(device),
    }
    pc.write_result(args.out, result)
    print(f"{result['contender']}: {total} steps in {wall_s:.3f}s ({total / wall_s:.2f} steps/s)")


if __name__ == "__main__":
    main()
