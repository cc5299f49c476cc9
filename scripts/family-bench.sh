#!/usr/bin/env bash
# Evaluation throughput and memory of mergescope's model families on the CPU, printed as a
# table (figures, not a pass/fail test):
#   - CLIP ViT-B/32-sized random weights (transformers' CLIPConfig defaults, 151 M parameters):
#     images per second of `mergescope eval` on 256 224x224 PNGs in 2 classes (decoding and
#     preprocessing included), and peak resident memory;
#   - all-MiniLM-L6-v2 (scripts/fetch-minilm.sh) with two made-up 2-class heads: sentences per
#     second of `mergescope eval` on 512 sentences, peak memory, and an 11 x 11 plane landscape
#     end to end (`analyze landscape --kind plane`, 64 sentences per task and point).
# Usage: scripts/family-bench.sh PYTHON WORKDIR
#   PYTHON: a Python with torch, transformers and pillow (to write the random CLIP and images);
#   WORKDIR: where the models and data go (about 1 GB). The release binary is built first.
set -euo pipefail
py="${1:?usage: family-bench.sh PYTHON WORKDIR}"
work="${2:?usage: family-bench.sh PYTHON WORKDIR}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
(cd "$root" && cargo build --release --workspace -q)
bin="$root/target/release/mergescope"
"$root/scripts/fetch-minilm.sh"
minilm="${MERGESCOPE_MINILM_DIR:-$HOME/.cache/mergescope/all-minilm-l6-v2}"

"$py" - "$work" "$minilm" <<'PY'
import json, os, shutil, sys
import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import CLIPConfig, CLIPModel

work, minilm = sys.argv[1], sys.argv[2]
clip = os.path.join(work, "clip-b32")
if not os.path.exists(os.path.join(clip, "model.safetensors")):
    torch.manual_seed(0)
    CLIPModel(CLIPConfig()).eval().save_pretrained(clip, safe_serialization=True)
    # A word-level tokenizer is enough for the prompts' cost; the ids stay below the vocabulary.
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "a", "photo", "of", "cat", "dog", "."])}
    vocab["<|startoftext|>"] = 49406
    vocab["<|endoftext|>"] = 49407
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", 49406), ("<|endoftext|>", 49407)])
    tk.save(os.path.join(clip, "tokenizer.json"))
rng = np.random.default_rng(0)
for c in ["cat", "dog"]:
    d = os.path.join(work, "images", c)
    os.makedirs(d, exist_ok=True)
    for k in range(128):
        p = os.path.join(d, f"{k:03d}.png")
        if not os.path.exists(p):
            Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(p)
with open(os.path.join(work, "clip.toml"), "w") as f:
    f.write(f'name = "clip-b32"\n[model]\nfamily = "clip"\n[[task]]\nname = "pets"\ndata = "{work}/images"\n')

# MiniLM "experts": the encoder with a little noise and a random 2-class head each.
base = load_file(os.path.join(minilm, "model.safetensors"))
for k, name in enumerate(["a", "b"]):
    d = os.path.join(work, f"minilm-{name}")
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(k)
    t = {n: (v + 0.01 * v.std() * torch.randn(v.shape, generator=g) if v.is_floating_point() else v) for n, v in base.items()}
    t["classifier.weight"] = 0.1 * torch.randn(2, 384, generator=g)
    t["classifier.bias"] = torch.zeros(2)
    save_file(t, os.path.join(d, "model.safetensors"))
    for f in ["config.json", "tokenizer.json"]:
        shutil.copy(os.path.join(minilm, f), d)
words = "the a model merge task vector fast slow good bad cat dog runs sits".split()
with open(os.path.join(work, "text.jsonl"), "w") as f:
    for k in range(512):
        f.write(json.dumps({"text": " ".join(rng.choice(words, 12)), "label": int(k % 2)}) + "\n")
with open(os.path.join(work, "text.toml"), "w") as f:
    f.write(f'name = "minilm"\n[model]\nfamily = "bert"\nconfig = "{minilm}/config.json"\ntokenizer = "{minilm}/tokenizer.json"\n'
            f'[[task]]\nname = "a"\ndata = "{work}/text.jsonl"\nhead = "{work}/minilm-a"\n'
            f'[[task]]\nname = "b"\ndata = "{work}/text.jsonl"\nhead = "{work}/minilm-b"\n'
            f'[models]\nbase = "{minilm}"\nexperts = ["{work}/minilm-a", "{work}/minilm-b"]\n')
PY

measure() { # label count unit command...
  local label="$1" count="$2" unit="$3"; shift 3
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$work/rss.txt" "$@" >/dev/null 2>"$work/err.txt" || { cat "$work/err.txt" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "s = $t1 - $t0; print(f'| $label | {s:.1f} s | {$count / s:.1f} $unit/s | {$(tail -1 "$work/rss.txt") / 1024:.0f} MB |')"
}
echo "| what | time | throughput | peak RSS |"
echo "|---|---:|---:|---:|"
measure "CLIP ViT-B/32, eval of 256 images" 256 images "$bin" eval --benchmark "$work/clip.toml" --checkpoint "$work/clip-b32" --json
measure "all-MiniLM-L6-v2, eval of 2 x 512 sentences" 1024 sentences "$bin" eval --benchmark "$work/text.toml" --checkpoint "$work/minilm-a" --json
measure "MiniLM 11x11 plane (121 models, 2 x 64 sentences each)" 121 models "$bin" analyze landscape --benchmark "$work/text.toml" --kind plane --through minilm-a,minilm-b --range=-0.5:1.5:11 --no-cache -q --csv "$work/plane.csv" --overwrite
