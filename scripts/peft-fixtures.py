#!/usr/bin/env python3
"""Make the LoRA fixtures: PEFT adapters of the tiny Llama and PEFT's own merges of them.

What it makes, under OUT_DIR (default tests/fixtures/peft):
  adapter-plain/     r 4, lora_alpha 8, on q_proj, v_proj and up_proj; A and B random (so the
                     update is not zero), adapter_config.json + adapter_model.safetensors
  adapter-rslora/    r 2, lora_alpha 4, use_rslora (scale alpha/sqrt(r)), alpha_pattern giving
                     v_proj alpha 1, on v_proj and down_proj, and lm_head in modules_to_save
                     (perturbed, so it differs from the base's)
  adapter-bias/      r 2, lora_alpha 4, lora_bias=True (lora_B has a bias: the layer's bias
                     gets lora_B.bias * scaling when merged), on q_proj and v_proj of base-bias/
  base-bias/         the tiny Llama with attention_bias=True (q/k/v/o_proj have biases),
                     random weights (seed 7), bfloat16 like the base
  merged-plain/, merged-rslora/, merged-bias/
                     peft's merge_and_unload() of each on its base, saved in float32
  manifest.json      torch/transformers/peft versions and what each adapter holds

The base is tests/fixtures/mergekit/inputs/base (scripts/mergekit-parity.py makes it). The
tests (tests/tests/end_to_end/lora.rs) apply the adapters as merge inputs and compare with
the merged folders, and extract adapters back; they need no Python. Run again to regenerate:

  ~/.cache/mergescope/mergekit-venv/bin/python scripts/peft-fixtures.py [OUT_DIR]

(the virtualenv scripts/mergekit-parity.py creates has torch, transformers and peft).
"""

import json
import shutil
import sys
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "tests" / "fixtures" / "mergekit" / "inputs" / "base"

CASES = {
    "plain": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]),
    "rslora": dict(
        r=2,
        lora_alpha=4,
        use_rslora=True,
        alpha_pattern={"v_proj": 1},
        target_modules=["v_proj", "down_proj"],
        modules_to_save=["lm_head"],
    ),
    "bias": dict(r=2, lora_alpha=4, lora_bias=True, target_modules=["q_proj", "v_proj"]),
}
# The cases whose base is base-bias/ (a base with biases), not the tiny Llama.
ON_BIAS_BASE = {"bias"}


def make_bias_base(out: Path) -> Path:
    """The tiny Llama with attention biases (attention_bias=True), random, in bfloat16."""
    folder = out / "base-bias"
    shutil.rmtree(folder, ignore_errors=True)
    config = transformers.AutoConfig.from_pretrained(BASE)
    config.attention_bias = True
    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    for f in folder.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            f.unlink()
    return folder


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fixtures" / "peft"
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "base": "tests/fixtures/mergekit/inputs/base",
        "cases": {},
    }
    bias_base = make_bias_base(out)
    for i, (name, cfg) in enumerate(CASES.items()):
        torch.manual_seed(100 + i)
        base_dir = bias_base if name in ON_BIAS_BASE else BASE
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(init_lora_weights=False, lora_dropout=0.0, **cfg))
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn_like(p) * 0.05)
                elif "modules_to_save" in pname:
                    p.add_(torch.randn_like(p) * 0.01)
        adapter_dir = out / f"adapter-{name}"
        merged_dir = out / f"merged-{name}"
        for d in (adapter_dir, merged_dir):
            shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(adapter_dir, safe_serialization=True)
        # No paths of this machine in the fixtures: the base as the repository names it.
        config_file = adapter_dir / "adapter_config.json"
        config = json.loads(config_file.read_text())
        config["base_model_name_or_path"] = (
            f"tests/fixtures/peft/{bias_base.name}" if name in ON_BIAS_BASE else manifest["base"]
        )
        # target_modules is a set in PEFT: sorted, so that a rerun writes the same file.
        if isinstance(config.get("target_modules"), list):
            config["target_modules"] = sorted(config["target_modules"])
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (adapter_dir / "README.md").unlink(missing_ok=True)
        merged = model.merge_and_unload()
        merged.save_pretrained(merged_dir, safe_serialization=True)
        for f in merged_dir.iterdir():
            if f.name not in ("model.safetensors", "config.json"):
                f.unlink()
        manifest["cases"][name] = {"config": cfg, "adapter": adapter_dir.name, "merged": merged_dir.name}
        if name in ON_BIAS_BASE:
            manifest["cases"][name]["base"] = bias_base.name
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
