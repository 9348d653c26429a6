#!/usr/bin/env python3
"""An mdBook preprocessor (docs/book.toml runs it after the `links` preprocessor): removes the
common indentation of every fenced code block, so that a region included from inside a function
(`{{#include ../../crates/.../examples/x.rs:anchor}}`) reads from the left margin.

mdBook calls it as `mdbook-dedent.py supports RENDERER` (exit 0: every renderer), then with
`[context, book]` as JSON on standard input, and reads the book back on standard output."""

import json
import re
import sys
import textwrap

FENCE = re.compile(r"^(```[^\n]*\n)(.*?)(^```[ \t]*$)", re.S | re.M)


def dedent_blocks(text):
    return FENCE.sub(lambda m: m.group(1) + textwrap.dedent(m.group(2)) + m.group(3), text)


def walk(node):
    if isinstance(node, dict):
        if isinstance(node.get("content"), str):
            node["content"] = dedent_blocks(node["content"])
        for value in node.values():
            walk(value)
    elif isinstance(node, list):
        for value in node:
            walk(value)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "supports":
        return 0
    _context, book = json.load(sys.stdin)
    walk(book)
    json.dump(book, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
