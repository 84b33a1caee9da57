#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tests/docs/check_docs.py: the API reference builds, and no public declaration lacks a doc comment.

Doxygen 1.9.4 reports most undocumented declarations itself (docs/Doxyfile turns every
warning into a failure), but says nothing about two kinds the project documents too:
concepts and enumerators. This script closes that gap. Run from the repository root:

  1. Doxygen with docs/Doxyfile (output moved to --out, warnings printed): the reference,
     failing on any warning.
  2. Doxygen again with EXTRACT_ALL=YES into XML only, so that undocumented declarations are
     listed too (docs/Doxyfile's exclusions of `detail` still apply).
  3. Every concept and every enumerator of a public or protected enum in that XML must carry
     a description; each that does not is printed as `file:line: error: ...`.
Exit status 0 when all three pass, 1 otherwise.
"""

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def run_doxygen(doxygen: str, doxyfile: Path) -> int:
    """Runs Doxygen on `doxyfile`, echoing its output; returns its exit status."""
    proc = subprocess.run([doxygen, str(doxyfile)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.stdout:
        sys.stdout.write(proc.stdout)
    return proc.returncode


def described(element) -> bool:
    """True when the element's brief or detailed description holds any text."""
    for tag in ("briefdescription", "detaileddescription"):
        node = element.find(tag)
        if node is not None and "".join(node.itertext()).strip():
            return True
    return False


def location(element) -> str:
    """`file:line` of a declaration, the file as a path from the repository root when it is a
    header (docs/Doxyfile strips `include/` from the names Doxygen reports)."""
    loc = element.find("location")
    if loc is None:
        return "?"
    file = loc.get("file", "?")
    if (Path("include") / file).is_file():
        file = str(Path("include") / file)
    return f"{file}:{loc.get('line', '?')}"


def undocumented(xml_dir: Path) -> list[str]:
    """The concepts and enumerators without a description, one message each."""
    compounds = []
    for path in sorted(xml_dir.glob("*.xml")):
        if path.name != "index.xml":
            compounds.extend(ET.parse(path).getroot().iter("compounddef"))
    # A private nested class is an internal, and so is everything inside it.
    private = [c.findtext("compoundname", "") + "::" for c in compounds if c.get("prot") == "private"]

    problems: dict[str, str] = {}  # by Doxygen id: a namespace enum also appears in its file
    for compound in compounds:
        name = compound.findtext("compoundname", "")
        if compound.get("prot") == "private" or any(name.startswith(p) for p in private):
            continue
        if compound.get("kind") == "concept" and not described(compound):
            problems[compound.get("id", name)] = f"{location(compound)}: error: concept {name} is not documented."
        for member in compound.iter("memberdef"):
            if member.get("kind") != "enum" or member.get("prot") == "private":
                continue
            enum_name = member.findtext("qualifiedname") or member.findtext("name", "")
            for value in member.iter("enumvalue"):
                if not described(value):
                    problems[value.get("id", "")] = (
                        f"{location(member)}: error: enumerator {enum_name}::{value.findtext('name', '')} "
                        "is not documented.")
    return sorted(problems.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doxygen", default="doxygen", help="the doxygen executable")
    parser.add_argument("--doxyfile", type=Path, default=Path("docs/Doxyfile"), help="the project's Doxyfile")
    parser.add_argument("--out", type=Path, default=Path("build/docs"), help="where the reference goes")
    args = parser.parse_args()

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    doxyfile = args.doxyfile.resolve()

    # 1. The reference itself; any warning fails.
    reference = out / "Doxyfile.reference"
    reference.write_text(f'@INCLUDE = "{doxyfile}"\nOUTPUT_DIRECTORY = "{out}"\nWARN_LOGFILE =\n')
    failed = run_doxygen(args.doxygen, reference) != 0

    # 2. Everything, documented or not, as XML.
    everything = out / "Doxyfile.everything"
    everything.write_text(
        f'@INCLUDE = "{doxyfile}"\nOUTPUT_DIRECTORY = "{out / "everything"}"\nWARN_LOGFILE =\n'
        "EXTRACT_ALL = YES\nWARNINGS = NO\nWARN_AS_ERROR = NO\nGENERATE_HTML = NO\nGENERATE_XML = YES\n")
    (out / "everything").mkdir(exist_ok=True)
    if run_doxygen(args.doxygen, everything) != 0:
        print("check_docs.py: the EXTRACT_ALL pass of Doxygen failed", file=sys.stderr)
        return 1

    # 3. Concepts and enumerators.
    problems = undocumented(out / "everything" / "xml")
    for line in problems:
        print(line)
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
