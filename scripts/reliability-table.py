#!/usr/bin/env python3
"""Prints the bad-input table of docs/reliability.md from a run of the bad-input suite:

    MERGESCOPE_CASES_OUT="$PWD/target/cases.jsonl" cargo test -p mergescope --test bad_inputs
    python3 scripts/reliability-table.py target/cases.jsonl

One row per test (its first refused command and message; paths of the test's temporary folder
shortened to their file names)."""
import json
import os
import re
import sys
import tempfile

rows = {}
for line in open(sys.argv[1], encoding="utf-8"):
    case = json.loads(line)
    test = case["test"].split("::")[-1]
    rows.setdefault(test, case)
print("| case | command | message |")
print("|---|---|---|")
for test in sorted(rows):
    case = rows[test]
    def shorten(s):
        # The tests' own temporary folders (tempfile names them .tmpXXXXXX).
        s = re.sub(re.escape(tempfile.gettempdir()) + r"/\.tmp[^/ ]+/", "", s)
        return s.replace(os.getcwd() + "/", "")
    cmd = shorten(" ".join(case["args"][:3]) + (" …" if len(case["args"]) > 3 else ""))
    message = case["message"]
    if "error:" in message:
        message = message[message.index("error:"):]
    msg = shorten(message).replace("|", "\\|").replace("\n", " ")
    print(f"| {test.replace('_', ' ')} | `{cmd}` | {msg} |")
