#!/usr/bin/env python3
"""Checks the relative links (and their #anchors) of Markdown files.

    python3 docs/check_links.py $(git ls-files -co --exclude-standard '*.md')
    python3 docs/check_links.py --tree ROOT   # every *.md under ROOT but build*/ and .git


Run from the repository root. Links with a scheme (https:, mailto:) are not
checked; links inside fenced code blocks are ignored. Anchors follow
GitHub's rule: the heading in lower case, punctuation other than '-'
dropped, spaces as '-'. Exits 1 when a link is broken.
"""
import os
import re
import sys

# Pages another change adds; a link to them is reported, not counted.
EXPECTED = set()


def slug(heading):
    h = heading.strip().lower().replace("`", "")
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path):
    out, fenced = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                out.add(slug(line.lstrip("#")))
    return out


def main(files):
    checked = broken = 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            text = re.sub(r"```.*?```", "", fh.read(), flags=re.S)
        for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", text):
            url = m.group(1)
            if re.match(r"^[a-z]+:", url):
                continue
            checked += 1
            target, _, frag = url.partition("#")
            path = os.path.normpath(os.path.join(os.path.dirname(f), target)) if target else f
            if not os.path.exists(path):
                if path in EXPECTED:
                    print(f"{f}: {url}: not there yet (expected from another change)")
                else:
                    print(f"{f}: {url}: no such file")
                    broken += 1
            elif frag and (os.path.isdir(path) or frag not in anchors(path)):
                print(f"{f}: {url}: no heading #{frag} in {path}")
                broken += 1
    print(f"{checked} relative links checked, {broken} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--tree"]:
        root = args[1] if len(args) > 1 else "."
        os.chdir(root)
        args = sorted(
            os.path.relpath(os.path.join(d, f))
            for d, dirs, files in os.walk(".")
            for f in files
            if f.endswith(".md")
            and not any(p.startswith(("build", ".git", "subprojects")) for p in d.split(os.sep)[1:2]))
    sys.exit(main(args))
