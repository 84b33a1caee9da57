#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tests/docs/check_links.py: every link of the documentation resolves inside the repository.

Usage: check_links.py REPO_ROOT [FILE.md ...]   (default: README.md, CHANGELOG.md, docs/*.md)
       check_links.py --self-test REPO_ROOT FILE.md ...

The documentation must work for a reader who has only this repository (a clone, a
FetchContent copy, a release archive). For each Markdown file, outside fenced code blocks
and HTML comments:
  1. Every link target, in [text](target), ![alt](target), [ref]: target, <a href>, <img src>:
     - a web address (http:, https:, mailto:) is accepted as it is (not fetched);
     - any other scheme (file:, ...) or an absolute path is an error: it names this machine;
     - a relative path must stay inside REPO_ROOT and name an existing file or folder;
     - a #fragment must name a heading of the target Markdown file (GitHub's anchors).
  2. An inline code span that names a relative path leaving the repository (`../x` from
     README.md, `../../x` from docs/) is an error too: a reader cannot follow it either.
Each problem is printed as `file:line: error: ...`. Exit status 0 when there is none, 1
otherwise. With --self-test, the exit status is 0 when the lines with a problem are exactly
the lines that end with the comment <!-- bad --> (tests/docs/fixtures/links.md).
"""

import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*\"([^\"]*)\"", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
WEB = re.compile(r"^(https?|mailto):", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def text_lines(path: Path):
    """(line number, line) of the file outside fenced code blocks and HTML comments."""
    fence = None
    in_comment = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        out = ""
        rest = line
        while rest:
            if in_comment:
                end = rest.find("-->")
                if end < 0:
                    rest = ""
                else:
                    rest, in_comment = rest[end + 3:], False
            else:
                start = rest.find("<!--")
                if start < 0:
                    out, rest = out + rest, ""
                else:
                    out, rest, in_comment = out + rest[:start], rest[start + 4:], True
        yield number, out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed,
    spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text)                         # HTML tags go
    text = text.replace("`", "").lower()
    kept = []
    for ch in text:
        if ch in " -_" or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path, cache: dict) -> set:
    """The anchors GitHub makes for the headings of a Markdown file (repeats get -1, -2 ...)."""
    if path not in cache:
        found, seen = set(), {}
        for _, line in text_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        for _, line in text_lines(path):  # explicit anchors: <a id="x"> / <a name="x">
            for m in re.finditer(r"<a\s+(?:id|name)\s*=\s*\"([^\"]+)\"", line):
                found.add(m.group(1))
        cache[path] = found
    return cache[path]


def inside(root: Path, target: Path) -> bool:
    try:
        target.resolve().relative_to(root)
        return True
    except ValueError:
        return False


def check_target(root: Path, md: Path, target: str, cache: dict) -> str | None:
    """The problem with one link target, or None."""
    if not target or WEB.match(target):
        return None
    if SCHEME.match(target):
        return f"'{target}' is not a web address: a reader's machine has no such file"
    path_part, _, fragment = target.partition("#")
    path_part = unquote(path_part)
    if path_part.startswith("/"):
        return f"'{target}' is an absolute path: link a file of the repository by a relative path"
    dest = (md.parent / path_part) if path_part else md
    if not inside(root, dest):
        return f"'{target}' leaves the repository"
    if not dest.exists():
        return f"'{target}' names a missing file"
    if fragment and dest.is_file() and dest.suffix.lower() == ".md":
        if unquote(fragment) not in anchors(dest.resolve(), cache):
            return f"'{target}': {dest.resolve().relative_to(root)} has no heading with the anchor #{fragment}"
    return None


def check_file(root: Path, md: Path, cache: dict) -> list[str]:
    problems = []
    rel = md.relative_to(root) if md.is_absolute() else md
    for number, line in text_lines(md):
        spans = [m.group(2).strip() for m in CODE_SPAN.finditer(line)]
        prose = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(prose)]
        targets += [m.group(1) for m in HTML_LINK.finditer(prose)]
        m = REFERENCE.match(prose)
        if m:
            targets.append(m.group(1))
        for target in targets:
            problem = check_target(root, md, target, cache)
            if problem:
                problems.append(f"{rel}:{number}: error: link {problem}")
        for span in spans:
            if span.startswith("../") and " " not in span and not inside(root, md.parent / span):
                problems.append(f"{rel}:{number}: error: `{span}` names a file outside the repository")
    return problems


def main(argv: list[str]) -> int:
    self_test = bool(argv) and argv[0] == "--self-test"
    if self_test:
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    root = Path(argv[0]).resolve()
    files = [root / f for f in argv[1:]] or (
        [root / "README.md", root / "CHANGELOG.md"] + sorted((root / "docs").glob("*.md")))
    cache: dict = {}
    problems = []
    checked = 0
    for md in files:
        if not md.is_file():
            problems.append(f"{md}: error: no such file")
            continue
        checked += 1
        problems.extend(check_file(root, md.resolve(), cache))
    for p in problems:
        print(p)
    print(f"check_links.py: {checked} files checked, {len(problems)} problems")
    if self_test:
        want = {f"{md.relative_to(root)}:{n}" for md in files if md.is_file()
                for n, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1)
                if line.rstrip().endswith("<!-- bad -->")}
        got = {p.split(": error:")[0] for p in problems}
        for line in sorted(want - got):
            print(f"{line}: self-test: this bad link was not reported")
        for line in sorted(got - want):
            print(f"{line}: self-test: reported, but not marked <!-- bad -->")
        return 0 if want == got and want else 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
