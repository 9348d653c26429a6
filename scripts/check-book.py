#!/usr/bin/env python3
"""Checks the book (docs/src) and the README against the repository, so that neither can rot.

    scripts/check-book.py                      # links, anchors, includes, code blocks, commands
    scripts/check-book.py --kolo target/debug/kolo   # also every `kolo SUB --option` against the binary

- Links: every relative link `[..](path)` and `[..](path#anchor)` names a file that exists and, with
  an anchor, a heading of that file (mdBook's ids: lower case, spaces to `-`, punctuation dropped);
  `[..](#anchor)` a heading of the same file. Every chapter of SUMMARY.md exists.
- Includes: `{{#include PATH:ANCHOR}}` names a file that has `ANCHOR: name` and `ANCHOR_END: name`
  lines; `{{#include PATH:A:B}}` lines that exist.
- Code blocks: `rust` and `python` blocks are includes of compiled or tested examples (in the book),
  or, in the README, a copy of an example's anchored region announced by
  `<!-- the ANCHOR: NAME region of PATH -->` and equal to it; `sh` blocks are commands (checked
  below); `text` blocks are output or diagrams. Anything else (`ignore`, no language) is an error.
- Commands (`sh` blocks, and `$ ` lines of `text` blocks): repository paths exist; an example run
  from target/*/examples/ exists in some crate; `cargo ... -p CRATE [--example NAME] [--features
  CRATE/FEATURE]` names crates, examples and features that exist; a script's `--options` appear in
  the script; with --kolo, a `kolo SUB`'s options appear in `kolo SUB --help`.

Prints each problem as `FILE:LINE: what` and exits 1 if there is any.
"""

import argparse
import glob
import os
import re
import shlex
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 150
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
INCLUDE = re.compile(r"\{\{#include ([^}:]+)(?::([^}]*))?\}\}")
MARKER = re.compile(r"<!-- the ANCHOR: (\S+) region of (\S+) -->\n```[^\n]*\n(.*?)^```", re.S | re.M)
KOLO_SUBCOMMANDS = {"run", "train", "bench", "simulate", "diagnose"}
# Options the kolo binary takes but does not show in --help (set by its launcher).
KOLO_HIDDEN = {"--worker"}
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

problems = []


def problem(path, line, what):
    problems.append(f"{os.path.relpath(path, ROOT)}:{line}: {what}")


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def heading_id(title):
    """mdBook's id of a heading: its text without markup, lower case, spaces as `-`."""
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # links: their text
    title = title.replace("`", "").replace("*", "")
    out = []
    for ch in title.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def heading_ids(path):
    text = strip_code(open(path, encoding="utf-8").read())
    ids, seen = set(), {}
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        base = heading_id(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def strip_code(text):
    """The text with fenced blocks blanked (their lines kept, so line numbers still hold)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def anchored(path, name):
    """The lines between `ANCHOR: name` and `ANCHOR_END: name`, dedented; None if absent."""
    lines = open(path, encoding="utf-8").read().splitlines()
    start = [i for i, l in enumerate(lines) if re.search(rf"\bANCHOR:\s*{re.escape(name)}\s*$", l)]
    end = [i for i, l in enumerate(lines) if re.search(rf"\bANCHOR_END:\s*{re.escape(name)}\s*$", l)]
    if len(start) != 1 or len(end) != 1 or end[0] <= start[0]:
        return None
    return textwrap.dedent("\n".join(lines[start[0] + 1:end[0]]) + "\n")


def check_links(path, text):
    here = os.path.dirname(path)
    body = strip_code(text)
    for m in LINK.finditer(body):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(here, file)) if file else path
        line = line_of(body, m.start())
        if not os.path.exists(dest):
            problem(path, line, f"link to {target}: {os.path.relpath(dest, ROOT)} does not exist")
            continue
        if anchor:
            if not dest.endswith(".md"):
                problem(path, line, f"link to {target}: an anchor into a file that is not Markdown")
            elif anchor not in heading_ids(dest):
                problem(path, line, f"link to {target}: no heading with id {anchor!r} there")


def check_includes(path, text):
    here = os.path.dirname(path)
    for m in INCLUDE.finditer(text):
        file, spec = m.group(1).strip(), (m.group(2) or "").strip()
        dest = os.path.normpath(os.path.join(here, file))
        line = line_of(text, m.start())
        if not os.path.isfile(dest):
            problem(path, line, f"include of {file}: no such file")
            continue
        if not spec:
            continue
        if re.fullmatch(r"\d*(:\d*)?", spec):
            count = len(open(dest, encoding="utf-8").read().splitlines())
            for n in re.findall(r"\d+", spec):
                if not 1 <= int(n) <= count:
                    problem(path, line, f"include of {file}:{spec}: the file has {count} lines")
        elif anchored(dest, spec) is None:
            problem(path, line, f"include of {file}: no single ANCHOR: {spec} ... ANCHOR_END: {spec}")


def check_readme_copies(path, text):
    for m in MARKER.finditer(text):
        name, file, block = m.groups()
        dest = os.path.join(ROOT, file)
        line = line_of(text, m.start())
        if not os.path.isfile(dest):
            problem(path, line, f"{file}: no such file")
            continue
        region = anchored(dest, name)
        if region is None:
            problem(path, line, f"{file} has no ANCHOR: {name} region")
        elif region.rstrip() != block.rstrip():
            problem(path, line, f"this copy differs from the ANCHOR: {name} region of {file}")


def check_blocks(path, text, is_readme, kolo):
    copies = {m.start(3) for m in MARKER.finditer(text)}
    for m in FENCE.finditer(text):
        info, body = m.group(1).strip(), m.group(2)
        lang = info.split(",")[0].strip()
        line = line_of(text, m.start())
        words = {w.strip() for w in info.split(",")}
        if words & {"ignore", "no_run", "should_panic", "compile_fail"}:
            problem(path, line, f"a ```{info} block: nothing would check it")
        elif lang in ("rust", "python"):
            include_only = re.fullmatch(r"\s*\{\{#include [^}]+\}\}\s*", body)
            if is_readme and m.start(2) not in copies:
                problem(path, line, f"a {lang} block without its <!-- the ANCHOR: ... --> marker")
            elif not is_readme and not include_only:
                problem(path, line, f"a {lang} block that is not an {{{{#include}}}} of an example")
        elif lang in ("sh", "bash", "console"):
            check_commands(path, line + 1, body.splitlines(), kolo)
        elif lang == "text":
            cmds = [(i, l[2:]) for i, l in enumerate(body.splitlines()) if l.startswith("$ ")]
            for i, cmd in cmds:
                check_commands(path, line + 1 + i, [cmd], kolo)
        else:
            problem(path, line, f"a code block with language {info!r} (use rust, python, sh or text)")


def logical_lines(lines, first):
    """(line number, command line) with backslash continuations joined and comments dropped."""
    buf, start = "", first
    for i, raw in enumerate(lines):
        if not buf:
            start = first + i
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        yield start, buf
        buf = ""
    if buf:
        yield start, buf


def words_of(cmd):
    try:
        lexer = shlex.shlex(cmd, posix=True, punctuation_chars="|&;")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        return list(lexer)
    except ValueError:
        return None


def split_commands(tokens):
    cmd = []
    for t in tokens:
        if t and set(t) <= set("|&;"):
            if cmd:
                yield cmd
            cmd = []
        else:
            cmd.append(t)
    if cmd:
        yield cmd


def crate_features(crate):
    toml = os.path.join(ROOT, "crates", crate, "Cargo.toml")
    text = open(toml, encoding="utf-8").read()
    section = re.search(r"^\[features\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    names = set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section.group(1), re.M)) if section else set()
    deps = set(re.findall(r"^([A-Za-z0-9_-]+)\s*=\s*\{[^}]*optional\s*=\s*true", text, re.M))
    return names | deps


def examples():
    found = set()
    for p in glob.glob(os.path.join(ROOT, "crates", "*", "examples", "*")):
        found.add(os.path.splitext(os.path.basename(p))[0])
    return found


HELP = {}


def kolo_help(kolo, sub):
    if sub not in HELP:
        out = subprocess.run([kolo, *sub.split(), "--help"], capture_output=True, text=True)
        HELP[sub] = set(re.findall(r"--[a-z0-9][a-z0-9-]*", out.stdout))
    return HELP[sub]


def check_commands(path, first, lines, kolo):
    known_examples = examples()
    for line, cmd in logical_lines(lines, first):
        tokens = words_of(cmd)
        if tokens is None:
            problem(path, line, f"cannot parse the command {cmd!r}")
            continue
        for words in split_commands(tokens):
            check_command(path, line, words, kolo, known_examples)


def check_command(path, line, words, kolo, known_examples):
    while words and ENV_ASSIGN.match(words[0]):
        words = words[1:]
    if not words:
        return
    for w in words:
        w = w.rstrip(",;)")
        m = re.match(r"^(scripts|crates|docs)/[^\s]+", w)
        if m and not glob.glob(os.path.join(ROOT, w)):
            problem(path, line, f"{w}: no such path")
        m = re.match(r"^target/(release|debug)/examples/([A-Za-z0-9_]+)$", w)
        if m and m.group(2) not in known_examples:
            problem(path, line, f"{w}: no example {m.group(2)} in crates/*/examples")
    if words[0] == "cargo":
        check_cargo(path, line, words)
    is_script = lambda w: re.match(r"^scripts/[\w.-]+$", w)  # noqa: E731
    script = next((w for w in words[:2] if is_script(w)), None)
    # A script that runs a command (scripts/netns-with.sh SCRIPT ...): the options are the inner one's.
    while script:
        inner = words[words.index(script) + 1:][:2]
        nested = next((w for w in inner if is_script(w)), None)
        if not nested:
            break
        script = nested
    if script and os.path.isfile(os.path.join(ROOT, script)):
        source = open(os.path.join(ROOT, script), encoding="utf-8").read()
        after = words[words.index(script) + 1:]
        for opt in after:
            opt = opt.split("=")[0]
            if re.match(r"^--[a-z]", opt) and opt not in source:
                problem(path, line, f"{script} has no option {opt}")
    for i, w in enumerate(words):
        if (w == "kolo" or w.endswith("/kolo")) and i + 1 < len(words) and words[i + 1] in KOLO_SUBCOMMANDS:
            check_kolo(path, line, words[i + 1:], kolo)
            break


def check_cargo(path, line, words):
    crate = None
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w == "-p":
            crate = nxt
            if not os.path.isdir(os.path.join(ROOT, "crates", crate)):
                problem(path, line, f"cargo -p {crate}: no such crate")
        elif w == "--example" and crate:
            if not glob.glob(os.path.join(ROOT, "crates", crate, "examples", nxt + "*")):
                problem(path, line, f"cargo --example {nxt}: not an example of {crate}")
        elif w == "--features":
            for feature in nxt.split(","):
                owner, _, name = feature.partition("/")
                if not name:
                    continue
                if not os.path.isdir(os.path.join(ROOT, "crates", owner)):
                    problem(path, line, f"--features {feature}: no crate {owner}")
                elif name not in crate_features(owner):
                    problem(path, line, f"--features {feature}: {owner} has no feature {name}")
        elif w == "--":
            break


def check_kolo(path, line, words, kolo):
    sub = words[0]
    rest = words[1:]
    if sub == "bench" and rest and rest[0] == "scaling":
        sub, rest = "bench scaling", rest[1:]
    if not kolo:
        return
    allowed = kolo_help(kolo, sub) | KOLO_HIDDEN
    for w in rest:
        if w == "--":
            break  # the program's own arguments
        opt = w.split("=")[0]
        if re.match(r"^--[a-z]", opt) and opt not in allowed:
            problem(path, line, f"kolo {sub} has no option {opt}")


def check_ids_against_html(chapters):
    """Where the book is built (docs/book), the ids computed here are the ones mdBook made."""
    src, out = os.path.join(ROOT, "docs", "src"), os.path.join(ROOT, "docs", "book")
    for chapter in chapters:
        html = os.path.join(out, os.path.relpath(chapter, src)[:-3] + ".html")
        if chapter.endswith("SUMMARY.md") or not os.path.isfile(html):
            continue
        made = set(re.findall(r'<h[1-6] id="([^"]+)"', open(html, encoding="utf-8").read()))
        for missing in sorted(heading_ids(chapter) - made):
            problem(chapter, 1, f"heading id {missing!r} is not among mdBook's ({html})")


def book_files():
    src = os.path.join(ROOT, "docs", "src")
    summary = os.path.join(src, "SUMMARY.md")
    files = [summary]
    text = open(summary, encoding="utf-8").read()
    for m in re.finditer(r"\]\(([^)]+\.md)\)", text):
        chapter = os.path.join(src, m.group(1))
        if not os.path.isfile(chapter):
            problem(summary, line_of(text, m.start()), f"chapter {m.group(1)} does not exist")
        else:
            files.append(chapter)
    listed = set(files)
    for p in glob.glob(os.path.join(src, "**", "*.md"), recursive=True):
        if p not in listed:
            problem(p, 1, "a chapter that SUMMARY.md does not list")
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kolo", help="the kolo binary, to check the options of `kolo` commands")
    a = ap.parse_args()
    kolo = os.path.abspath(a.kolo) if a.kolo else None
    readme = os.path.join(ROOT, "README.md")
    files = [readme] + book_files()
    for path in files:
        text = open(path, encoding="utf-8").read()
        is_readme = path == readme
        check_links(path, text)
        check_includes(path, text)
        check_blocks(path, text, is_readme, kolo)
        if is_readme:
            check_readme_copies(path, text)
            if text.count("\n") > README_MAX_LINES:
                problem(path, 1, f"{text.count(chr(10))} lines (at most {README_MAX_LINES})")
    check_ids_against_html(files[1:])
    for p in problems:
        print(p)
    what = "links, includes, code blocks and commands" + (" (with kolo's options)" if kolo else "")
    print(f"check-book: {len(files)} files, {what}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
