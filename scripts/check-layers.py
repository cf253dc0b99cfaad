#!/usr/bin/env python3
"""Check that the engine's imports run downwards only (docs/ARCHITECTURE.md, "Layers").

Every `crate::…` and `super::…` path in crates/alignfs/src is resolved to the module (or,
inside volume/, the file) it names. An import of a higher layer fails the check, and so
does a circle among modules (or volume/ files) of one layer. Tests are left out: a test
may use anything. Prints each offending import; exits 1 if there is one."""

from __future__ import annotations

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "crates" / "alignfs" / "src"

# The crate's top-level modules, bottom layer first.
LAYERS = [
    ["map", "stats", "codec", "error"],
    ["meta", "geometry", "background"],
    ["device", "layout", "partition"],
    ["journal", "options"],
    ["kv", "lines"],
    ["residue"],
    ["profile"],
    ["volume"],
    ["personality"],
    ["paths"],
]
# volume/'s files, bottom first: its parts, the engine, the data path, the facade.
VOLUME_LAYERS = [
    ["devices", "clean_pages", "migrator"],
    ["block_store"],
    ["committer"],
    ["engine"],
    ["read", "eof", "write", "resize", "migrate", "clone", "namespace", "check"],
    ["engine_api", "maintenance"],
    ["open", "recover"],
    ["mod"],
]
IGNORED = {"lib", "test_support"}


def layer_of(name: str, layers: list) -> int | None:
    return next((i for i, names in enumerate(layers) if name in names), None)


def strip_tests(text: str) -> str:
    """The file without its `#[cfg(test)]` items (a test module, a test-only import)."""
    out, skip_depth, depth, pending = [], None, 0, False
    for line in text.split("\n"):
        stripped = line.strip()
        if skip_depth is None and stripped.startswith("#[cfg(test)]"):
            pending = True
            continue
        if pending and skip_depth is None:
            pending = False
            if "{" not in stripped:  # a single-line item, such as `use …;`
                continue
            skip_depth = depth
        depth += line.count("{") - line.count("}")
        if skip_depth is not None:
            if depth <= skip_depth:
                skip_depth = None
            continue
        out.append(line)
    return "\n".join(out)


def code_only(text: str) -> str:
    """Comments and string literals blanked, so that paths in docs do not count."""
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def volume_reexports() -> dict:
    """Names volume/mod.rs re-exports, and the file each comes from."""
    text = (SRC / "volume" / "mod.rs").read_text()
    names = {}
    for m in re.finditer(r"^\s*pub(?:\([a-z]+\))? use (\w+)::(\{[^}]*\}|\w+);", text, re.M):
        module, items = m.group(1), m.group(2).strip("{}")
        for item in re.split(r"[,\s]+", items):
            if item:
                names[item.split(" as ")[0]] = module
    return names


def main() -> int:
    files = sorted(p for p in SRC.rglob("*.rs") if p.name != "tests.rs" and "tests" not in p.relative_to(SRC).parts[:-1])
    reexported = volume_reexports()
    edges: dict = {}
    bad = []
    for path in files:
        rel = path.relative_to(SRC)
        top = rel.parts[0].removesuffix(".rs")
        if top in IGNORED:
            continue
        text = code_only(strip_tests(path.read_text()))
        targets = set()
        for m in re.finditer(r"\bcrate::(\w+)(?:::(\w+))?", text):
            targets.add((m.group(1), m.group(2)))
        in_volume = top == "volume"
        if in_volume:
            for m in re.finditer(r"\bsuper::(\{[^}]*\}|\w+)", text):
                for item in re.split(r"[,\s]+", m.group(1).strip("{}")):
                    item = item.split("::")[0]
                    if item and item not in ("self", "super"):
                        targets.add(("volume", item))
        here = layer_of(top, LAYERS)
        if here is None:
            bad.append(f"{rel}: module {top} has no layer in scripts/check-layers.py")
            continue
        for module, item in targets:
            if module in IGNORED or module == "Result" or module[0].isupper():
                there = here  # a re-export at the crate root, such as crate::Error
                continue
            there = layer_of(module, LAYERS)
            if there is None:
                continue
            if there > here:
                bad.append(f"{rel}: imports {module} (layer {there}) from layer {here}")
            elif module != top:
                edges.setdefault(top, set()).add(module)
            if in_volume and module == "volume" and item:
                source = rel.stem if len(rel.parts) == 2 else rel.parts[1]
                target = reexported.get(item, item)
                a, b = layer_of(source, VOLUME_LAYERS), layer_of(target, VOLUME_LAYERS)
                if a is None:
                    bad.append(f"{rel}: volume/{source}.rs has no layer in scripts/check-layers.py")
                elif b is not None and b > a:
                    bad.append(f"{rel}: imports volume/{target}.rs (layer {b}) from layer {a}")
                elif b is not None and target != source:
                    edges.setdefault(f"volume/{source}", set()).add(f"volume/{target}")
    # Circles among the modules (or volume/ files) of one layer.
    seen, stack = set(), []

    def visit(node):
        if node in stack:
            bad.append("circle: " + " -> ".join(stack[stack.index(node):] + [node]))
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            visit(nxt)
        stack.pop()

    for node in sorted(edges):
        visit(node)
    for line in bad:
        print(line)
    print(f"check-layers: {len(files)} files, {sum(len(v) for v in edges.values())} imports between modules, "
          f"{len(bad)} against the layers")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
