"""The Python side of bench/lora.sh: the model, and `peft` LoRA training on it.

  lora.py make DIR LAYERS WIDTH INTER VOCAB HEADS KV
                                   a random Qwen2 (tied head) of that shape, save_pretrained (float32)
  lora.py peft DIR STEPS BATCH SEQ THREADS RANK ALPHA
                                   get_peft_model(LoraConfig(r=RANK, lora_alpha=ALPHA, every projection))
                                   trained with torch's AdamW (foreach) on the adapters, on BATCH x SEQ
                                   random ids below 256 (as ptrain's synthetic bytes), for STEPS steps:
                                   steps/s over all of them, the last loss, trainable parameters and
                                   the peak RSS, as JSON
"""
import json
import resource
import sys
import time


def out(obj):
    obj["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(obj))


def make(d, layers, width, inter, vocab, heads, kv):
    import torch
    import transformers

    config = transformers.Qwen2Config(vocab_size=int(vocab), hidden_size=int(width), intermediate_size=int(inter),
                                      num_hidden_layers=int(layers), num_attention_heads=int(heads),
                                      num_key_value_heads=int(kv), max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(d)
    out({"parameters": sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(d).parameters())})


def peft(d, steps, batch, seq, threads, rank, alpha):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(int(threads))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=int(rank), lora_alpha=float(alpha), lora_dropout=0.0, target_modules=targets))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)
    batches = [torch.randint(0, 256, (int(batch), int(seq))) for _ in range(int(steps))]
    start = time.perf_counter()
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    last = loss.item()
    elapsed = time.perf_counter() - start
    out({"steps_per_s": int(steps) / elapsed, "last_loss": last, "trainable": sum(p.numel() for p in trainable)})


COMMANDS = {"make": make, "peft": peft}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
