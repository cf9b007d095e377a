# Time to load a model directory with transformers (float32, CPU), the import and from_pretrained timed apart;
# with --lora R, peft's get_peft_model (bench/memory.py's peft_lora) timed after it; with --import-modeling,
# the modeling code from_pretrained would import lazily (Qwen2's, modeling_utils) imported and timed before it:
#   .venv/bin/python bench/hf_load.py DIR [--lora R] [--import-modeling]   (issue 41: against ptrain's setup_s)
import sys, time, json
t0 = time.perf_counter()
import torch, transformers
if "--lora" in sys.argv:
    import peft  # imported here so that import_s counts it; peft_lora finds it loaded

    from memory import peft_lora
torch.set_num_threads(2)
t1 = time.perf_counter()
out = {"import_s": t1 - t0}
if "--import-modeling" in sys.argv:
    import transformers.modeling_utils
    from transformers import Qwen2ForCausalLM

    out["modeling_import_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="float32", attn_implementation="sdpa")
t2 = time.perf_counter()
out["from_pretrained_s"] = t2 - t1
if "--import-modeling" in sys.argv:
    # Every weight read once: they are views of the mapped file until touched.
    with torch.no_grad():
        sum(p.sum().item() for p in m.parameters())
    out["read_weights_s"] = time.perf_counter() - t2
    t2 = time.perf_counter()
if "--lora" in sys.argv:
    m = peft_lora(m, int(sys.argv[sys.argv.index("--lora") + 1]))
    out["get_peft_model_s"] = time.perf_counter() - t2
print(json.dumps(out))
