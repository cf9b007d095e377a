"""Contender (e): the training in PyTorch Lightning, with TensorBoard logging and
checkpoints at the cadences of ptrain's tensorboard and checkpoint plugins.

Same model, data, optimizer and schedule as bench/torch_eager.py (pycommon.py),
inside a LightningModule and `Trainer.fit`:

* `TensorBoardLogger`, `log_every_n_steps=10`: the training loss and (through
  `LearningRateMonitor`) the learning rate every 10 steps, like ptrain's
  tensorboard `scalars` attachment; parameter and gradient histograms every 500
  steps (a small callback, `add_histogram`), like its `histograms` attachment;
  the evaluation loss at the end.
* `ModelCheckpoint(every_n_train_steps=1000)` plus one at the end of training
  (`every_n_epochs=1`: the run is one epoch of exactly `train.steps` batches),
  like ptrain's checkpoint plugin (every 1000 steps and at the end). Model and
  optimizer state, as ptrain's.
* Gradient clipping through `gradient_clip_val` (global norm); the learning rate
  through a per-step `LambdaLR` with ptrain's warmup + cosine values.
* The held-out evaluation at the end: `train.eval_batches` batches.
* No progress bar, no model summary, no sanity validation (ptrain --quiet
  prints a progress line every `run.log_every` steps; this prints nothing).

The wall time runs from Lightning's `on_train_start` (after its set-up) to the
return of `Trainer.fit` (so it includes the final evaluation, the last
checkpoint and the logger's flush, as ptrain's `wall_s` includes its end-of-run
flush).

    .venv/bin/python bench/lightning_run.py --config bench/configs/mlp.toml --steps 1000 --run-dir /tmp/l --out r.json
"""

import logging
import os
import pathlib
import time
import warnings

import torch

import pycommon as pc

# Lightning's advice (more data-loader workers, and so on) is not what is measured.
warnings.filterwarnings("ignore")
logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
os.environ.setdefault("PL_DISABLE_FORK", "1")

import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402

LOG_EVERY = 10  # ptrain's tensorboard scalars cadence
HISTOGRAMS_EVERY = 500  # ptrain's tensorboard histograms cadence
CHECKPOINT_EVERY = 1000  # ptrain's checkpoint cadence (and at the end)


class Batches(torch.utils.data.IterableDataset):
    """`count` batches made inline on the training thread, like torch_eager.py."""

    def __init__(self, data, split, count, config):
        self.data, self.split, self.count, self.config = data, split, count, config

    def __len__(self):
        return self.count

    def __iter__(self):
        for i in range(self.count):
            if self.split == "train":
                x, y, _ = self.data.batch()
            else:
                x, y, _ = self.data.batch("val", pc.eval_generator(self.config, i))
            yield x, y


class Module(L.LightningModule):
    def __init__(self, config, data):
        super().__init__()
        self.config = config
        self.net = pc.model(config, data)
        self.first_loss = None
        self.last_loss = None

    def training_step(self, batch, _index):
        x, y = batch
        loss = pc.loss_fn(self.net(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=False)
        detached = loss.detach()
        if self.first_loss is None:
            self.first_loss = detached
        self.last_loss = detached
        return loss

    def validation_step(self, batch, _index):
        x, y = batch
        logits = self.net(x)
        self.log("eval/loss", pc.loss_fn(logits, y), on_step=False, on_epoch=True)
        if logits.dim() == 2:
            self.log("eval/accuracy", (logits.argmax(-1) == y).float().mean(), on_step=False, on_epoch=True)

    def configure_optimizers(self):
        optimizer = pc.adamw(self.net, self.config, self.device)
        peak = self.config["optim"]["lr"]
        # LambdaLR's factor i applies to the optimizer's step i + 1 (ptrain counts from 1).
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: pc.lr_at(self.config, i + 1) / peak)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Histograms(Callback):
    """Parameter and gradient histograms every HISTOGRAMS_EVERY steps."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step % HISTOGRAMS_EVERY != 0:
            return
        writer = trainer.logger.experiment
        for name, p in module.net.named_parameters():
            writer.add_histogram(f"params/{name}", p.detach(), step)
            if p.grad is not None:
                writer.add_histogram(f"grads/{name}", p.grad, step)


class Clock(Callback):
    """Marks the start of the training loop proper."""

    started = None

    def on_train_start(self, trainer, module):
        Clock.started = time.perf_counter()


def main():
    args = pc.common_args(__doc__.splitlines()[0]).parse_args()
    config, device = pc.resolve(args)
    run_dir = pathlib.Path(args.run_dir or "bench/out/lightning-run")
    data = pc.dataset(config, device)
    module = Module(config, data)

    total = config["train"]["steps"]
    accum = max(config["optim"]["accum_steps"], 1)
    if total % CHECKPOINT_EVERY == 0:
        print("note: train.steps is a multiple of 1000: the last step is checkpointed twice", flush=True)
    bf16 = device.type == "cuda" and config["train"]["precision"] == "bf16"
    trainer = L.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        precision="bf16-mixed" if bf16 else "32-true",
        max_steps=total,
        max_epochs=1,
        accumulate_grad_batches=accum,
        gradient_clip_val=config["optim"]["grad_clip"] or None,
        gradient_clip_algorithm="norm",
        log_every_n_steps=LOG_EVERY,
        limit_val_batches=max(config["train"]["eval_batches"], 1),
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        logger=TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version=""),
        callbacks=[
            ModelCheckpoint(dirpath=run_dir / "checkpoints", every_n_train_steps=CHECKPOINT_EVERY, save_top_k=-1),
            ModelCheckpoint(
                dirpath=run_dir / "checkpoints", filename="end-{step}", every_n_epochs=1, save_on_train_epoch_end=True
            ),
            LearningRateMonitor(logging_interval="step"),
            Histograms(),
            Clock(),
        ],
    )
    train = torch.utils.data.DataLoader(Batches(data, "train", total * accum, config), batch_size=None)
    val = torch.utils.data.DataLoader(Batches(data, "val", max(config["train"]["eval_batches"], 1), config), batch_size=None)
    trainer.fit(module, train, val)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall_s = time.perf_counter() - Clock.started

    metrics = trainer.callback_metrics
    steps = trainer.global_step
    accuracy = metrics.get("eval/accuracy")
    result = {
        "contender": "lightning",
        "steps": steps,
        "wall_s": wall_s,
        "steps_per_s": steps / wall_s,
        "first_loss": module.first_loss.item(),
        "final_loss": module.last_loss.item(),
        "final_eval_loss": metrics["eval/loss"].item() if "eval/loss" in metrics else None,
        "final_eval_accuracy": accuracy.item() if accuracy is not None else None,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "optimizer": "torch.optim.AdamW(fused=True)",
        "lightning": L.__version__,
        "checkpoints": sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt")),
    }
    pc.write_result(args.out, result)
    print(f"lightning: {steps} steps in {wall_s:.3f}s ({steps / wall_s:.2f} steps/s); "
          f"loss {result['first_loss']:.4f} -> {result['final_loss']:.4f}, eval {result['final_eval_loss']}")


if __name__ == "__main__":
    main()
