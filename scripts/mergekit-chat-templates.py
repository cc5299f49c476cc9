#!/usr/bin/env python3
"""Check mergescope's named chat templates against mergekit's bundled ones, by rendering.

mergekit's `chat_template: chatml` (alpaca, chatml, exaone, llama3, mistral) writes a template
it bundles into the output tokenizer. mergescope ships its own templates under
assets/chat_templates/ (written for mergescope, not copied from mergekit) that must render every
chat exactly as mergekit's do. This script renders both with transformers' own chat-template
renderer (jinja2 with trim_blocks and lstrip_blocks, `raise_exception`, bos/eos tokens) on a set
of chats (system first, late and repeated; alternating and not; user_context; empty turns;
surrounding whitespace; multi-line, unicode and brace-carrying text; no messages), each with and
without the generation prompt, and compares the strings (or that both fail).

When every case agrees it writes tests/fixtures/chat_templates/verified.json: the SHA-256 of
each template it checked, the number of cases and the mergekit and transformers versions. The
Rust test `named_chat_templates_are_the_verified_ones` checks the shipped templates against
those hashes, so a template edited without running this script again fails CI.

How to run (mergekit's virtualenv, as scripts/mergekit-parity.py makes it):
  python3 scripts/mergekit-chat-templates.py [--venv ~/.cache/mergescope/mergekit-venv]
"""

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "assets" / "chat_templates"
OUT = ROOT / "tests" / "fixtures" / "chat_templates" / "verified.json"
NAMES = ["alpaca", "chatml", "exaone", "llama3", "mistral"]

CHECK = r'''
import importlib.metadata, importlib.resources, itertools, json, sys
from transformers.utils.chat_template_utils import render_jinja_template
from mergekit._data import chat_templates

def render(template, chat, prompt):
    try:
        out = render_jinja_template(conversations=[chat], chat_template=template, add_generation_prompt=prompt,
                                    bos_token="<s>", eos_token="</s>")
        return out[0][0]
    except Exception as e:  # both must fail the same way
        return "error: " + type(e).__name__

def m(role, text):
    return {"role": role, "content": text}

S, U, A, C = (lambda t: m("system", t)), (lambda t: m("user", t)), (lambda t: m("assistant", t)), (lambda t: m("user_context", t))
CHATS = [
    [], [U("hi")], [S("Be brief."), U("hi")], [U("a"), A("b"), U("c")], [S(" s "), U("  x  "), A(" y \n"), U("z")],
    [U("a"), A("b")], [S("s1"), S("s2"), U("q")], [U("q"), C("ctx"), A("r")], [A("lead")], [U("a"), U("b")],
    [S("only")], [U("multi\nline\n\ntext")], [U(""), A("")], [S("s"), U("u"), A("a"), U("u2"), A("a2")],
    [m("tool", "t")], [U("x"), S("late"), A("y")], [U("{{ not a tag }} {% raw %}"), A("é ü 你好 🙂")],
    [S("sys\n"), U("\tq\t"), A("a"), U("b"), A("c"), U("d")], [C("only context")], [U("q"), A("a"), S("s")],
]
names = json.loads(sys.argv[1])
ours = json.loads(sys.argv[2])
failures, cases = [], 0
for name in names:
    theirs = importlib.resources.files(chat_templates).joinpath(name + ".jinja").read_text()
    for chat, prompt in itertools.product(CHATS, [False, True]):
        cases += 1
        a, b = render(theirs, chat, prompt), render(ours[name], chat, prompt)
        if a != b:
            failures.append({"template": name, "chat": chat, "add_generation_prompt": prompt, "mergekit": a, "mergescope": b})
print(json.dumps({"failures": failures, "cases_per_template": len(CHATS) * 2,
                  "mergekit": importlib.metadata.version("mergekit"),
                  "transformers": importlib.metadata.version("transformers")}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "mergescope" / "mergekit-venv")
    args = ap.parse_args()
    py = args.venv / "bin" / "python"
    if not py.is_file():
        sys.exit(f"{py} not found: make mergekit's virtualenv first (python3 scripts/mergekit-parity.py OUT_DIR), or pass --venv")
    ours = {n: (TEMPLATES / f"{n}.jinja").read_text(encoding="utf-8") for n in NAMES}
    done = subprocess.run([py, "-c", CHECK, json.dumps(NAMES), json.dumps(ours)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the check failed inside {args.venv}:\n{done.stderr}")
    result = json.loads(done.stdout)
    for f in result["failures"]:
        print(f"{f['template']}: chat {json.dumps(f['chat'])} generation prompt {f['add_generation_prompt']}\n"
              f"  mergekit:   {f['mergekit']!r}\n  mergescope: {f['mergescope']!r}")
    if result["failures"]:
        sys.exit(f"{len(result['failures'])} renderings differ; {OUT} left as it was")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    verified = {
        "mergekit": result["mergekit"],
        "transformers": result["transformers"],
        "cases_per_template": result["cases_per_template"],
        "sha256": {n: hashlib.sha256(ours[n].encode("utf-8")).hexdigest() for n in NAMES},
    }
    OUT.write_text(json.dumps(verified, indent=2) + "\n", encoding="utf-8")
    print(f"all {result['cases_per_template']} chats agree for {', '.join(NAMES)} "
          f"(mergekit {result['mergekit']}, transformers {result['transformers']}); wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
