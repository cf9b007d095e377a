"""The `peft` side of tests/lora.rs: loads what `ptrain export --format peft` wrote with
the real `peft` and compares its logits with ptrain's. Models come from chat.py's
make_model and hf.py's make-model. Each command prints one JSON object.

  lora.py make-wide DIR            a random Qwen2 1024 wide (1 layer, intermediate 2816,
                                   GQA 8:2, vocab 300, tied), its tokenizer and chat.jsonl:
                                   wide enough that rank-8 adapters are ~1% of the parameters
  lora.py perturb SRC DST TENSOR     a copy of the model SRC in DST with TENSOR changed a little:
                                   another base of the same shapes
  lora.py peft-load BASE ADAPTER PROBE
                                   PeftModel.from_pretrained(BASE, ADAPTER): the adapter keys the
                                   model has and the file lacks (missing) and the other way round
                                   (unexpected), peft's warnings, the largest |lora_B|, and the
                                   logits on PROBE's inputs vs ptrain's (`ptrain logits`)
  lora.py make-peft BASE OUT        peft's own adapter on BASE (a mixture of experts): rank 4, alpha 8,
                                   target_modules q_proj and target_parameters the router
                                   (mlp.gate.weight) and both stacked experts, every lora_B drawn
                                   (init_lora_weights=False), save_pretrained(OUT)
  lora.py same-tokenizer A B       AutoTokenizer of A and of B: the same chat template, the same ids for
                                   a rendered conversation, the same eos token
  lora.py compare-params A B        the largest difference, relative to the tensor's largest value,
                                   between two safetensors files of the same tensors
"""
import json
import os
import random
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import chat  # noqa: E402


def out(obj):
    print(json.dumps(obj))


def make_wide(d):
    rng = random.Random(7)
    tok = chat.make_model(d, rng, 300, 128, True, hidden_size=1024, intermediate_size=2816, num_hidden_layers=1,
                          num_attention_heads=8, num_key_value_heads=2)
    with open(f"{d}/chat.jsonl", "w") as f:
        for _ in range(16):
            f.write(json.dumps({"messages": chat.conversation(rng)}) + "\n")
    out({"vocab": tok.get_vocab_size()})


def perturb(src, dst, name):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(f"{src}/model.safetensors")
    tensors[name] = tensors[name] + 0.01 * torch.randn_like(tensors[name])
    save_file(tensors, f"{dst}/model.safetensors", metadata={"format": "pt"})
    out({"perturbed": name})


def peft_load(base, adapter, probe_path):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft_model = PeftModel.from_pretrained(model, adapter)
    peft_model.eval()
    saved = set(load_file(f"{adapter}/adapter_model.safetensors"))
    # peft keeps adapters under their name ("default"); it saves them without it.
    live = {k.replace(".default", "") for k in peft_model.state_dict() if "lora_" in k}
    probe = load_file(probe_path)
    with torch.no_grad():
        logits = peft_model(probe["inputs"]).logits
    lora_b = max(p.abs().max().item() for n, p in peft_model.named_parameters() if "lora_B" in n)
    # The largest |lora_B| of each adapted module ("mlp.experts.base_layer", "mlp.gate", ...).
    by_module = {}
    for n, p in peft_model.named_parameters():
        if "lora_B" in n and ".layers." in n:
            module = n.split(".layers.", 1)[1].split(".", 1)[1].split(".lora_B")[0]
            by_module[module] = max(by_module.get(module, 0.0), p.abs().max().item())
    out({
        "missing": sorted(live - saved),
        "unexpected": sorted(saved - live),
        "adapters": len(saved),
        "warnings": [str(w.message) for w in caught],
        "max_lora_b": lora_b,
        "max_lora_b_by_module": by_module,
        "max_abs_diff": (logits - probe["logits"]).abs().max().item(),
        "logit_scale": logits.abs().max().item(),
    })


def make_peft(base, out_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], init_lora_weights=False,
                        target_parameters=["mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    peft_model.save_pretrained(out_dir)
    out({"adapters": sum(1 for n, _ in peft_model.named_parameters() if "lora_" in n)})


def compare_params(a, b):
    from safetensors.torch import load_file

    ta, tb = load_file(a), load_file(b)
    rel = max((ta[k] - tb[k]).abs().max().item() / max(ta[k].abs().max().item(), 1e-12) for k in ta)
    out({"max_rel": rel, "tensors": len(ta), "same_names": sorted(ta) == sorted(tb)})


def same_tokenizer(a, b):
    from transformers import AutoTokenizer

    ta, tb = AutoTokenizer.from_pretrained(a), AutoTokenizer.from_pretrained(b)
    messages = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "general kenobi"}]
    ids = [t.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"] for t in (ta, tb)]
    out({"same_template": ta.chat_template == tb.chat_template and ta.chat_template is not None,
         "same_ids": ids[0] == ids[1], "ids": len(ids[0]), "same_eos": ta.eos_token == tb.eos_token})


COMMANDS = {"make-wide": make_wide, "make-peft": make_peft, "same-tokenizer": same_tokenizer, "perturb": perturb, "peft-load": peft_load, "compare-params": compare_params}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
