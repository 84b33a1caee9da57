#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that the code in a guide is the code of the quickstart programs.

Usage: check_snippets.py [--subset] GUIDE.md REPO_ROOT

In the guide, every ```cpp and ```cmake block is preceded by a marker line
    <!-- snippet: examples/quickstart/FILE REGION -->
and must equal, line for line, the lines of FILE between the comments "[REGION-begin]" and
"[REGION-end]" (// or #), with their common indentation removed. Every region marked in a
file the guide names must appear in the guide. Exits 1 with a diff for each difference.
Every block of the guide is looked at, so a section added to the guide is checked as soon
as it exists.

--subset (the README): the guide may show some regions of a file only, and a ```cpp block
may go without a marker (docs.readme_snippets compiles those); a ```cmake block still needs
one.
"""
import difflib
import pathlib
import re
import sys

MARKER = re.compile(r"^<!-- snippet: (\S+) (\S+) -->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
REGION = re.compile(r"\[([\w.-]+)-(begin|end)\]")
CHECKED_LANGUAGES = {"cpp", "cmake"}


def dedent(lines):
    indents = [len(l) - len(l.lstrip(" ")) for l in lines if l.strip()]
    cut = min(indents, default=0)
    return [l[cut:].rstrip() for l in lines]


def regions(path):
    """Region name -> its lines (dedented); raises ValueError for unbalanced markers."""
    found, open_at, body = {}, {}, {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = REGION.search(line)
        if not m:
            for name in open_at:
                body[name].append(line)
            continue
        name, edge = m.groups()
        if edge == "begin":
            if name in open_at or name in found:
                raise ValueError(f"{path}:{number}: region '{name}' begins twice")
            open_at[name], body[name] = number, []
        else:
            if name not in open_at:
                raise ValueError(f"{path}:{number}: region '{name}' ends without a begin")
            del open_at[name]
            found[name] = dedent(body.pop(name))
    if open_at:
        name, number = next(iter(open_at.items()))
        raise ValueError(f"{path}:{number}: region '{name}' never ends")
    return found


def blocks(guide):
    """(line number, marker or None, language, lines) of every fenced block in the guide."""
    lines = guide.read_text().splitlines()
    out, i, marker = [], 0, None
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            marker = (m.group(1), m.group(2), i + 1)
            i += 1
            continue
        f = FENCE.match(lines[i])
        if f:
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append((start, marker, f.group(1), [l.rstrip() for l in lines[start:j]]))
            marker, i = None, j + 1
            continue
        if lines[i].strip():
            marker = None  # a marker applies to the block right after it only
        i += 1
    return out


def main(guide_path, root_path, subset=False):
    guide, root = pathlib.Path(guide_path), pathlib.Path(root_path)
    errors, used, sources = [], set(), {}
    checked = {"cmake"} if subset else CHECKED_LANGUAGES
    for line, marker, language, code in blocks(guide):
        if marker is None:
            if language in checked:
                errors.append(f"{guide}:{line}: a {language} block without a snippet marker")
            continue
        file, name, marker_line = marker
        try:
            if file not in sources:
                sources[file] = regions(root / file)
        except (OSError, ValueError) as e:
            errors.append(f"{guide}:{marker_line}: {e}")
            continue
        used.add((file, name))
        want = sources[file].get(name)
        if want is None:
            errors.append(f"{guide}:{marker_line}: {file} has no region '{name}'")
        elif code != want:
            diff = difflib.unified_diff(want, code, f"{file} [{name}]", f"{guide}:{line}", lineterm="")
            errors.append(f"{guide}:{line}: the snippet differs from {file} [{name}]:\n" + "\n".join(diff))
    for file, found in sources.items() if not subset else ():
        for name in found:
            if (file, name) not in used:
                errors.append(f"{file}: region '{name}' is not shown in {guide}")
    for e in errors:
        print(e)
    print(f"{len(used)} snippets from {len(sources)} files checked, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    subset = args[:1] == ["--subset"]
    if subset:
        args = args[1:]
    if len(args) != 2:
        sys.exit(__doc__)
    sys.exit(main(args[0], args[1], subset))
