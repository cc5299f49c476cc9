#!/usr/bin/env python3
"""Non-test lines of Rust code per crate (and per module with --modules).

Counts lines that are neither blank nor comments (`//`, `///`, `//!`), leaving out
`#[cfg(test)]` items (a `mod tests { ... }` block or a single item) and files under
`tests/` or named `tests.rs`. The architecture's size limits are read in these lines.

    scripts/code-lines.py [--modules] [CRATE_DIR ...]
"""
import pathlib
import re
import sys


def code_lines(text: str) -> int:
    lines = text.splitlines()
    count = 0
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("#[cfg(test)]"):
            # Skip the attributed item: up to its matching closing brace, or a `;` line.
            depth = 0
            opened = False
            i += 1
            while i < len(lines):
                code = re.sub(r'"(\\.|[^"\\])*"', '""', lines[i].split("//")[0])
                depth += code.count("{") - code.count("}")
                opened = opened or "{" in code
                if (opened and depth <= 0) or (not opened and code.rstrip().endswith(";")):
                    break
                i += 1
            i += 1
            continue
        if stripped and not stripped.startswith("//"):
            count += 1
        i += 1
    return count


def rust_files(root: pathlib.Path):
    for path in sorted(root.rglob("*.rs")):
        parts = path.relative_to(root).parts
        if "tests" in parts[:-1] or path.name == "tests.rs" or "target" in parts or "benches" in parts:
            continue
        yield path


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    modules = "--modules" in sys.argv
    roots = [pathlib.Path(a) for a in args] or sorted(
        p.parent for p in pathlib.Path(".").glob("*/*/Cargo.toml") if "third_party" not in p.parts
    ) + [pathlib.Path("plugin-api")]
    for root in roots:
        total = 0
        for path in rust_files(root / "src" if (root / "src").is_dir() else root):
            n = code_lines(path.read_text(encoding="utf-8"))
            total += n
            if modules:
                print(f"{n:7d}  {path}")
        print(f"{total:7d}  {root} (total)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
