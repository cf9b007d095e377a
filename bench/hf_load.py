# Time to load a model directory with transformers (float32, CPU), the import and from_pretrained timed apart;
# with --lora R, peft's get_peft_model (r=R on the seven projections, as bench/memory.py) timed after it:
#   .venv/bin/python bench/hf_load.py DIR [--lora R]   (issue 41: against ptrain summary.json's setup_s)
import sys, time, json
t0 = time.perf_counter()
import torch, transformers
if "--lora" in sys.argv:
    import peft
torch.set_num_threads(2)
t1 = time.perf_counter()
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="float32", attn_implementation="sdpa")
t2 = time.perf_counter()
out = {"import_s": t1 - t0, "from_pretrained_s": t2 - t1}
if "--lora" in sys.argv:
    rank = int(sys.argv[sys.argv.index("--lora") + 1])
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    m = peft.get_peft_model(m, peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets))
    out["get_peft_model_s"] = time.perf_counter() - t2
print(json.dumps(out))
