#!/usr/bin/env python3
"""Checks the settings table (src/base/settings.hpp) against what it documents.

    check_settings.py doc SHMRUN DOC_FILE
        DOC_FILE must equal `SHMRUN --info --markdown` (it is generated).
    check_settings.py names SHMRUN SOURCE_ROOT DIR...
        Every SHMRING_* name in the sources under SOURCE_ROOT/DIR... that is
        not a macro or an enumerator (build macros, include guards, the C
        API's constants) must be a variable declared in the table.

    check_settings.py info SHMRUN
        `SHMRUN --info` shows each value with its source, grouped by
        audience, and exits 1 naming a value the workers would refuse.
    check_settings.py self-test SHMRUN PLANTED_DIR
        `names` must fail on PLANTED_DIR (which reads SHMRING_PLANTED_KNOB,
        declared nowhere) and name that variable and its line.

Exits 1 naming every difference. tests/launcher/meson.build runs `names` on
src, python and tools, and `self-test` on settings_planted/.
"""

import contextlib
import io

import difflib
import re
import subprocess
import sys
from pathlib import Path

NAME = re.compile(r"\bSHMRING_[A-Z0-9_]+")
SUFFIXES = {".c", ".h", ".cpp", ".hpp", ".inc", ".in", ".py", ".sh"}
# Macros: #define'd (include guards, helpers), tested with #if, or passed as
# -D by a meson.build; enumerators of the C API (SHMRING_SUM = 0,).
DEFINE = re.compile(r"^\s*#\s*(?:define|ifndef|ifdef|undef|if|elif)\b.*?\b(SHMRING_[A-Z0-9_]+)",
                    re.M)
MESON_D = re.compile(r"-D(SHMRING_[A-Z0-9_]+)")
ENUMERATOR = re.compile(r"^\s*(SHMRING_[A-Z0-9_]+)\s*(?:=[^=]|,|$)", re.M)


def shmrun_markdown(shmrun):
    return subprocess.run([shmrun, "--info", "--markdown"], check=True, capture_output=True,
                          text=True).stdout


def declared(shmrun):
    return set(re.findall(r"^\| `(SHMRING_[A-Z0-9_]+)` \|", shmrun_markdown(shmrun), re.M))


def sources(folder):
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        if path.suffix in SUFFIXES:
            yield path
        elif path.suffix == "" and path.read_bytes()[:2] == b"#!":
            yield path  # scripts: tools/check, tools/sanitize, ...


def macros(root, dirs):
    """Names the build or the C preprocessor defines: not variables."""
    found = set()
    for top in {"include", "src", "python", "tools", *dirs}:
        folder = root / top
        if not folder.is_dir():
            continue
        for path in folder.rglob("*"):
            if not path.is_file():
                continue
            if path.name == "meson.build":
                found |= set(MESON_D.findall(path.read_text(errors="replace")))
            elif path.suffix in {".c", ".h", ".cpp", ".hpp", ".inc", ".in"}:
                text = path.read_text(errors="replace")
                found |= set(DEFINE.findall(text))
                if path.suffix in {".h", ".hpp"}:
                    found |= set(ENUMERATOR.findall(text))
    return found


def check_doc(shmrun, doc):
    want = shmrun_markdown(shmrun)
    have = Path(doc).read_text() if Path(doc).exists() else ""
    if want == have:
        print(f"{doc} equals `shmrun --info --markdown`")
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(have.splitlines(True), want.splitlines(True), doc,
                             "shmrun --info --markdown"))
    print(f"\n{doc} differs from `shmrun --info --markdown`: regenerate it with\n"
          f"  build/tools/shmrun --info --markdown > docs/reference/environment.md")
    return 1


def check_names(shmrun, root, dirs):
    root = Path(root)
    table = declared(shmrun)
    skip = macros(root, dirs)
    missing = {}
    for d in dirs:
        folder = root / d
        for path in sources(folder):
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for name in NAME.findall(line):
                    # "SHMRING_LOCAL_*": a family named in prose, not a name.
                    if name.endswith("_") or name in table or name in skip:
                        continue
                    missing.setdefault(name, f"{path.relative_to(root)}:{n}")
    for name, where in sorted(missing.items()):
        print(f"{where}: {name} is not declared in src/base/settings.hpp (kSettings)")
    if missing:
        return 1
    print(f"every SHMRING_* variable in {', '.join(dirs)} is declared ({len(table)} in the table)")
    return 0


def check_info(shmrun):
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHMRING_")}
    env["SHMRING_SLOTS"] = "8"
    env["SHMRING_ALGO"] = "direct"
    run = subprocess.run(
        [shmrun, "--info", "-n", "3", "-x", "SHMRING_ALGO=ring", "--threads", "2"],
        capture_output=True, text=True, env=env)
    out = run.stdout
    failures = []
    for line in ["  SHMRING_SLOTS = 8  [environment]", "  SHMRING_ALGO = ring  [command line]",
                 "  SHMRING_THREADS = 2  [command line]", "  SHMRING_TIMEOUT = 300  [default]",
                 "  SHMRING_WORLD_SIZE = 3  [shmrun]", "  SHMRING_JOB_ID = fresh per job  [shmrun]",
                 "      Ring slots per rank (shmrun --slots).",
                 "      default: 4; allowed: an integer in [2, 62]; read by: libshmring"]:
        if line + "\n" not in out:
            failures.append(f"missing line: {line!r}")
    titles = [out.find(t) for t in ("\nUser settings", "\nTuning", "\nDebugging", "\nDevelopment")]
    if -1 in titles or titles != sorted(titles):
        failures.append(f"audience groups missing or out of order: {titles}")
    if run.returncode != 0:
        failures.append(f"exit {run.returncode} with every value good")
    # -n N: the algorithm table's choices for N ranks (src/engine/tuning.cpp).
    for want in ("algorithm choices for N=3 ranks", ", SHMRING_ALGO=ring",
                 "forced by SHMRING_ALGO"):
        if want not in out:
            failures.append(f"--info -n 3 -x SHMRING_ALGO=ring: missing {want!r}")
    env2 = {k: v for k, v in env.items() if k not in ("SHMRING_ALGO", "SHMRING_SLOTS")}
    env2["SHMRING_OVERSUBSCRIBED"] = "0"
    two = subprocess.run([shmrun, "--info", "-n", "2"], capture_output=True, text=True, env=env2)
    rows = [l.split() for l in two.stdout.splitlines()
            if l.startswith("  allreduce ") and "(16-bit)" not in l]
    # N=2 on CPUs of their own: the line up to 104 B, one-shot to 512 B, the
    # ring above (its own row up to the 64 KiB direct buffer, then past it).
    expect = [["allreduce", "8", "B", "..", "64", "B", "low-latency"],
              ["allreduce", "128", "B", "..", "512", "B", "direct"],
              ["allreduce", "1", "KiB", "..", "64", "KiB", "ring"],
              ["allreduce", "128", "KiB", "..", "64", "MiB", "ring"]]
    if [r[:7] for r in rows] != expect:
        failures.append(f"--info -n 2: allreduce rows {[r[:7] for r in rows]}, expected {expect}")
    env["SHMRING_SLOTS"] = "99"
    bad = subprocess.run([shmrun, "--info"], capture_output=True, text=True, env=env)
    want = "      refused: SHMRING_SLOTS='99': expected an integer in [2, 62]\n"
    if bad.returncode != 1 or want not in bad.stdout:
        failures.append(f"SHMRING_SLOTS=99: expected exit 1 and {want!r}, got exit "
                        f"{bad.returncode}")
    for f in failures:
        print(f)
    if failures:
        print("--- shmrun --info said:\n" + out)
        return 1
    print("shmrun --info shows values, sources and refusals")
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "info":
        return check_info(argv[2])
    if len(argv) == 4 and argv[1] == "doc":
        return check_doc(argv[2], argv[3])
    if len(argv) >= 5 and argv[1] == "names":
        return check_names(argv[2], argv[3], argv[4:])
    if len(argv) == 4 and argv[1] == "self-test":
        planted = Path(argv[3])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = check_names(argv[2], planted.parent, [planted.name])
        print(out.getvalue(), end="")
        want = f"{planted.name}/planted.cpp:6: SHMRING_PLANTED_KNOB is not declared"
        if rc == 1 and want in out.getvalue():
            print("self-test: the planted name fails the check, as it must")
            return 0
        print(f"self-test: expected exit 1 and '{want}', got exit {rc}")
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
