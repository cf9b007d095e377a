# Time to load a model directory with transformers (float32, CPU), the import and from_pretrained timed apart:
#   .venv/bin/python bench/hf_load.py DIR   (issue 41: against ptrain summary.json's setup_s)
import sys, time, json
t0 = time.perf_counter()
import torch, transformers
torch.set_num_threads(2)
t1 = time.perf_counter()
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="float32", attn_implementation="sdpa")
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "from_pretrained_s": t2 - t1}))
