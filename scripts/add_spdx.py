#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/add_spdx.py: puts the licence's SPDX line in every source file that lacks it.

Usage: scripts/add_spdx.py [--check] [REPO_ROOT]   (default: the repository of this script)

  - C++ and CUDA sources (.hpp .cpp .cu .cuh) under include/ examples/ tests/ bench/:
    `// SPDX-License-Identifier: Apache-2.0` becomes the first line.
  - Scripts (a file under scripts/ or any of those folders that starts with `#!`, and *.py,
    *.sh): `# SPDX-License-Identifier: Apache-2.0` right after the shebang line (first when
    there is none).
  - CMake files (CMakeLists.txt, *.cmake, *.cmake.in) anywhere outside build folders:
    `# SPDX-License-Identifier: Apache-2.0` as the first line.
A file whose first lines (the first three) already carry an SPDX-License-Identifier is
left alone, so running it twice changes nothing. Generated and build folders (build/, .git/,
folders named build*) are skipped. Prints each file it changes; with --check it changes
nothing and exits 1 when some file lacks the line.
"""

import sys
from pathlib import Path

LICENSE = "Apache-2.0"
CXX_SUFFIXES = {".hpp", ".cpp", ".cu", ".cuh"}
CXX_FOLDERS = ("include", "examples", "tests", "bench")
SCRIPT_SUFFIXES = {".py", ".sh"}
SKIP_PARTS = {".git", "__pycache__", "node_modules"}


def skipped(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return any(p in SKIP_PARTS or p.startswith("build") for p in parts[:-1])


def has_spdx(lines: list[str]) -> bool:
    return any("SPDX-License-Identifier:" in line for line in lines[:3])


def is_cmake(path: Path) -> bool:
    return path.name == "CMakeLists.txt" or path.name.endswith((".cmake", ".cmake.in"))


def candidates(root: Path):
    """(path, comment) of every file that should carry the line."""
    seen = set()
    for folder in CXX_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and path.suffix in CXX_SUFFIXES and not skipped(path, root):
                seen.add(path)
                yield path, "//"
    for path in sorted(root.rglob("*")):
        if path in seen or not path.is_file() or path.is_symlink() or skipped(path, root):
            continue
        if is_cmake(path):
            yield path, "#"
            continue
        in_scripts = path.relative_to(root).parts[0] == "scripts"
        if path.suffix in SCRIPT_SUFFIXES or (in_scripts and starts_with_shebang(path)):
            if path.relative_to(root).parts[0] in ("scripts",) + CXX_FOLDERS:
                yield path, "#"


def starts_with_shebang(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def with_spdx(text: str, comment: str) -> str:
    line = f"{comment} SPDX-License-Identifier: {LICENSE}\n"
    if comment == "#" and text.startswith("#!"):
        end = text.find("\n")
        if end < 0:
            return text + "\n" + line
        return text[:end + 1] + line + text[end + 1:]
    return line + text


def main(argv: list[str]) -> int:
    check = "--check" in argv
    rest = [a for a in argv if a != "--check"]
    if any(a in ("-h", "--help") for a in rest):
        print(__doc__)
        return 0
    root = Path(rest[0]) if rest else Path(__file__).resolve().parent.parent
    root = root.resolve()
    missing = 0
    for path, comment in candidates(root):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if has_spdx(text.splitlines()):
            continue
        missing += 1
        print(("lacks SPDX: " if check else "added SPDX: ") + str(path.relative_to(root)))
        if not check:
            mode = path.stat().st_mode
            path.write_text(with_spdx(text, comment), encoding="utf-8")
            path.chmod(mode)
    if check:
        return 1 if missing else 0
    print(f"add_spdx.py: {missing} files changed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
