"""TRL's SFTTrainer on the Qwen2-0.5B shape, with and without Liger-Kernel: the loop most
ptrain users come from, on the weights and token stream gpu/qwen05b.py makes (gpu/lent.sh
runs ptrain on the same). Rows are windows of SEQ + 1 ids at the same random offsets as
qwen05b.py's loop, given as pretokenized `input_ids` (no packing needed: every row is full);
bf16, fused AdamW, lr 1e-5 constant, gradient clipping 1.0, no evaluation, no saving.

  trl_sft.py MODEL_DIR TOKENS_FILE BATCH SEQ STEPS [--liger]

Prints one JSON line: tokens/s over every step and after 3 warm-up steps (timed by a
callback at each step's end, after a device sync), the first and last loss, the peak
CUDA memory, the versions of trl and liger_kernel. On a host without CUDA it runs in
float32 on the CPU (gpu/lent.sh --smoke checks the script there; Liger needs Triton on
a GPU and is refused without one).
"""
import json
import sys
import time

import numpy as np
import torch


def rows(tokens_file, batch, seq, steps):
    from datasets import Dataset

    data = torch.from_numpy(np.fromfile(tokens_file, dtype=np.uint16).astype(np.int64))
    gen = torch.Generator().manual_seed(0)
    ids = []
    for _ in range(steps):
        at = torch.randint(0, data.numel() - seq - 1, (batch,), generator=gen)
        ids += [data[i:i + seq + 1].tolist() for i in at.tolist()]
    return Dataset.from_dict({"input_ids": ids})


def main(model_dir, tokens_file, batch, seq, steps, liger):
    import transformers
    import trl
    from trl import SFTConfig, SFTTrainer

    cuda = torch.cuda.is_available()
    if liger and not cuda:
        sys.exit("Liger-Kernel needs a CUDA device (Triton kernels)")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    times, losses = [], []
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not times:
                sync()
                times.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            sync()
            times.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    config = SFTConfig(
        output_dir="/tmp/trl-sft-out", max_steps=steps, per_device_train_batch_size=batch, max_length=seq + 1,
        learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.1, adam_beta2=0.95,
        max_grad_norm=1.0, bf16=cuda, use_cpu=not cuda, logging_steps=1, save_strategy="no", report_to="none",
        use_liger_kernel=liger, dataloader_num_workers=0, seed=0, data_seed=0, packing=False,
        optim="adamw_torch_fused" if cuda else "adamw_torch", disable_tqdm=True,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=rows(tokens_file, batch, seq, steps), callbacks=[Clock()])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    tokens = batch * seq
    r = {"tokens_per_s": tokens * steps / (times[-1] - times[0]), "first_loss": losses[0] if losses else None,
         "final_loss": losses[-1] if losses else None, "trl": trl.__version__, "liger": liger}
    if steps > 3:
        r["tokens_per_s_after_3"] = tokens * (steps - 3) / (times[-1] - times[3])
    if liger:
        import liger_kernel

        r["liger_kernel"] = getattr(liger_kernel, "__version__", "installed")
    if cuda:
        r["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        r["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) < 5:
        sys.exit(__doc__)
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), liger="--liger" in a)
