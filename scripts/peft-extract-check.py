#!/usr/bin/env python3
"""Check `mergescope extract-lora` adapters with PEFT itself (run by hand, not in CI).

It makes a fine-tuned tiny Llama from tests/fixtures/mergekit/inputs/base whose layer
matrices, token embeddings, lm_head and two RMS norms all differ from the base, extracts
adapters of it with `mergescope extract-lora` (default: embeddings, lm_head and norms saved
whole as modules_to_save; --embed-lora: lora_embedding_A/B and a LoRA pair for lm_head;
--modules-to-save for one q_proj; a model with 6 tokens added, whose embeddings --embed-lora
saves whole), loads each with `PeftModel.from_pretrained` on the base and
prints the largest difference of its logits (and of `merge_and_unload()`'s weights) from the
fine-tuned model's. At full rank (32, the hidden size) the adapter is the model up to float32
rounding; at rank 4 the layer matrices lose their SVD tail. With --mergekit it does the same
for mergekit-extract-lora's adapters of the same model, for comparison.

  cargo build -p mergescope --bin mergescope
  ~/.cache/mergescope/mergekit-venv/bin/python scripts/peft-extract-check.py \
      [--mergescope target/debug/mergescope] [--mergekit] [--tolerance 1e-4]

Exits non-zero when PEFT reports missing or unexpected adapter keys, or a full-rank adapter's
logits differ from the model's by more than --tolerance.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "tests" / "fixtures" / "mergekit" / "inputs" / "base"
IDS = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4, 63, 0, 31, 17]])

CHANGED = ["model.embed_tokens", "lm_head", "model.layers.0.input_layernorm", "model.norm"]


def load_base():
    model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    return model.eval()


def make_fine_tuned(folder):
    torch.manual_seed(22)
    model = load_base()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                # a rank-3 update per matrix, as a fine-tune's
                u = torch.randn(p.shape[0], 3) * 0.05
                v = torch.randn(3, p.shape[1]) * 0.05
                p.add_(u @ v)
            elif any(name == f"{m}.weight" for m in CHANGED):
                p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def logits_of(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def check(label, adapter, ft_logits, ft_state, vocab=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        base = load_base()
        if vocab is not None:
            base.resize_token_embeddings(vocab)
        peft_model = PeftModel.from_pretrained(base, adapter).eval()
    keys_problem = [str(w.message) for w in caught if "keys" in str(w.message).lower()]
    d_logits = float((logits_of(peft_model) - ft_logits).abs().max())
    merged = peft_model.merge_and_unload().state_dict()
    d_weights = max(float((merged[k] - w).abs().max()) for k, w in ft_state.items())
    print(f"{label:<34} max |Δ logits| {d_logits:.3e}   max |Δ weights| {d_weights:.3e}")
    for msg in keys_problem:
        print(f"    PEFT: {msg}")
    return d_logits, not keys_problem


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mergescope", default=str(ROOT / "target" / "debug" / "mergescope"))
    ap.add_argument("--mergekit", action="store_true", help="also check mergekit-extract-lora's adapters")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ft_dir = tmp / "fine-tuned"
        ft = make_fine_tuned(ft_dir).eval()
        ft_logits, ft_state = logits_of(ft), ft.state_dict()
        base_logits = logits_of(load_base())
        print(f"fine-tuned vs base: max |Δ logits| {float((ft_logits - base_logits).abs().max()):.3e}")
        cases = [
            ("default, rank 32", 32, []),
            ("--embed-lora, rank 32", 32, ["--embed-lora"]),
            ("--modules-to-save q_proj, rank 32", 32, ["--modules-to-save", "model.layers.1.self_attn.q_proj"]),
            ("default, rank 4", 4, []),
            ("--embed-lora, rank 4", 4, ["--embed-lora"]),
        ]
        for label, rank, extra in cases:
            out = tmp / f"ms-{len(label)}-{rank}-{len(extra)}"
            cmd = [args.mergescope, "extract-lora", "--base", str(BASE), "--model", str(ft_dir)]
            cmd += ["--rank", str(rank), "--out", str(out), *extra]
            subprocess.run(cmd, check=True, capture_output=True)
            d, keys_ok = check(f"mergescope {label}", out, ft_logits, ft_state)
            ok = ok and keys_ok and (rank < 32 or d <= args.tolerance)
        # Tokens added: --embed-lora falls back to saving embeddings and lm_head whole; PEFT
        # loads that on the base resized to the new vocabulary.
        with torch.no_grad():
            ft.resize_token_embeddings(70)
            ft.get_input_embeddings().weight[64:] = torch.randn(6, 32) * 0.05
            ft.get_output_embeddings().weight[64:] = torch.randn(6, 32) * 0.05
        resized_dir = tmp / "resized"
        ft.save_pretrained(resized_dir, safe_serialization=True)
        out = tmp / "ms-resized"
        cmd = [args.mergescope, "extract-lora", "--base", str(BASE), "--model", str(resized_dir)]
        subprocess.run(cmd + ["--rank", "32", "--out", str(out), "--embed-lora"], check=True, capture_output=True)
        d, keys_ok = check("mergescope 70 tokens, --embed-lora", out, logits_of(ft), ft.state_dict(), vocab=70)
        ok = ok and keys_ok and d <= args.tolerance
        if args.mergekit:
            tool = Path(sys.executable).parent / "mergekit-extract-lora"
            for label, extra in [("default", []), ("--embed-lora", ["--embed-lora"])]:
                out = tmp / f"mk-{len(extra)}"
                cmd = [str(tool), "--model", str(ft_dir), "--base-model", str(BASE), "--out-path", str(out)]
                cmd += ["--max-rank", "32", *extra]
                subprocess.run(cmd, check=True, capture_output=True)
                check(f"mergekit {label}, rank 32", out, ft_logits, ft_state)
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
