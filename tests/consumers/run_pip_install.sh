#!/usr/bin/env bash
# `pip install .` the way the README tells a Python user: a fresh venv over
# Debian's python3 with --system-site-packages (numpy, torch from Debian),
# --no-build-isolation so Debian's meson-python builds it, --no-index so
# nothing is fetched. Then, from outside the source tree, the installed
# shmrun (on the venv's PATH) runs a 2-rank allreduce in the installed
# package. Skips (77) without python3-venv or python3-mesonpy.
# Usage: run_pip_install.sh SRCDIR BUILDDIR
set -euo pipefail
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd)
py=/usr/bin/python3
"$py" -c 'import ensurepip, venv' 2>/dev/null || { echo "skip: python3-venv missing"; exit 77; }
"$py" -c 'import mesonpy' 2>/dev/null || { echo "skip: python3-mesonpy missing"; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shmring-pip.XXXXXX")
# The wheel's build directory sits beside this build's, at the same depth
# from the source tree, so that the compile lines match and ccache serves
# the library's objects instead of compiling them again.
wheel_build="${build}-wheel-$$"
trap 'rm -rf "$tmp" "$wheel_build"' EXIT

"$py" -m venv --system-site-packages "$tmp/venv"
# meson-python 0.12 leaves .mesonpy-native-file.ini in the source tree and,
# finding it again, "reconfigures" the new (empty) build directory: fails.
rm -f "$src/.mesonpy-native-file.ini"
start=$(date +%s)
(cd "$src" && "$tmp/venv/bin/pip" install --no-build-isolation --no-index --no-cache-dir \
  --config-settings builddir="$wheel_build" . >"$tmp/pip.log" 2>&1) || { tail -n 60 "$tmp/pip.log"; exit 1; }
echo "pip install took $(($(date +%s) - start)) s"
grep -i "warning" "$tmp/pip.log" | grep -iv "deprecat" || true
# What the wheel brought: the package, the bundled library, shmrun.
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
for f in "$site"/shmring/__init__.py "$site"/shmring/_shmring.*.so "$site"/.shmring.mesonpy.libs/libshmring.so \
  "$tmp/venv/bin/shmrun"; do
  test -e "$f" || { echo "missing after pip install: $f"; ls -R "$site/shmring"; exit 1; }
done

export PATH="$tmp/venv/bin:$PATH"
unset PYTHONPATH
hash -r
test "$(command -v shmrun)" = "$tmp/venv/bin/shmrun" || { echo "shmrun not on the venv's PATH"; exit 1; }
cat >"$tmp/allreduce.py" <<'PY'
import os, sys
import numpy as np
import shmring

# Imported from the venv, not from the source or build tree.
assert os.path.realpath(shmring.__file__).startswith(os.path.realpath(sys.prefix)), shmring.__file__
with shmring.Communicator() as comm:
    r, n = comm.rank, comm.size
    x = np.arange(1001, dtype=np.float64) + 1000.0 * r
    comm.allreduce(x)
    want = n * np.arange(1001, dtype=np.float64) + 1000.0 * n * (n - 1) / 2
    assert np.array_equal(x, want), (r, x[:4], want[:4])
    print(f"pip: rank {r} of {n} ok (shmring {shmring.__version__} from {os.path.dirname(shmring.__file__)})")
PY
cd "$tmp"
out=$(shmrun -n 2 --timeout 120 -- python "$tmp/allreduce.py")
echo "$out"
for r in 0 1; do
  grep -q "pip: rank $r of 2 ok" <<<"$out" || { echo "rank $r did not report ok"; exit 1; }
done
