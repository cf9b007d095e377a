"""Lightning's own EarlyStopping on a given sequence of eval losses, for
tests/early_stop.rs: a real `lightning.pytorch.Trainer.fit` whose validation of
epoch i logs the i-th loss, watched by `lightning.pytorch.callbacks.EarlyStopping`
(min mode, checked after each validation).

    early_stop.py EVALS_JSON PATIENCE MIN_DELTA [BEST WAIT]

EVALS_JSON is a list of [step, loss]. BEST and WAIT restore the callback's state
(its `load_state_dict`), as a resumed run would. Prints one JSON line: null when
Lightning never stops, else {"step", "best", "wait"} at the check that stopped it.
"""
import json
import logging
import sys
import warnings

import torch
from torch.utils.data import DataLoader

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


class Replay(pl.LightningModule):
    """Trains nothing; its validation logs the next loss of the sequence."""

    def __init__(self, losses):
        super().__init__()
        self.losses = losses
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, _):
        return (self.w * batch).sum()

    def validation_step(self, batch, _):
        # float64 so that Lightning compares the very values ptrain compared.
        self.log("loss", torch.tensor(self.losses[self.current_epoch], dtype=torch.float64))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return DataLoader([torch.zeros(1)], batch_size=1)

    def val_dataloader(self):
        return DataLoader([torch.zeros(1)], batch_size=1)


def main():
    evals = json.loads(sys.argv[1])
    patience, min_delta = int(sys.argv[2]), float(sys.argv[3])
    callback = EarlyStopping(monitor="loss", mode="min", patience=patience, min_delta=min_delta, check_on_train_epoch_end=False)
    if len(sys.argv) > 4:
        best, wait = float(sys.argv[4]), int(sys.argv[5])
        callback.load_state_dict({"wait_count": wait, "stopped_epoch": 0, "best_score": torch.tensor(best, dtype=torch.float64), "patience": patience})
    trainer = pl.Trainer(
        max_epochs=len(evals),
        callbacks=[callback],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Replay([loss for _, loss in evals]))
    if not trainer.should_stop:
        print("null")
        return
    print(json.dumps({"step": evals[callback.stopped_epoch][0], "best": callback.best_score.item(), "wait": callback.wait_count}))


if __name__ == "__main__":
    main()
