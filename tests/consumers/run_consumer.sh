#!/usr/bin/env bash
# Builds tests/consumers/consumer.cpp the way a user of shmring would and runs
# it on 2 ranks:
#   cmake       find_package(shmring) against a DESTDIR install of this build
#   pkgconfig   g++ $(pkg-config --cflags --libs shmring) against the same
#   subproject  meson, with subprojects/shmring -> this source tree
#   buildtree   g++ $(pkg-config --cflags --libs shmring-uninstalled) against
#               this build, as docs/getting-started/cpp.md says; where the
#               MPI layer was built, also a program of it linked through
#               shmring-mpi-uninstalled (docs/guide/multi-node.md)
# The installed shmrun launches the ranks (the source tree's for subproject).
# The install must also hold `man shmrun` (when help2man built it).
# Usage: run_consumer.sh MODE SRCDIR BUILDDIR PREFIX BINDIR LIBDIR MANDIR
# Exit 77 (skip) when the tool the mode needs is missing.
set -euo pipefail
mode=$1 src=$2 build=$3 prefix=$4 bindir=$5 libdir=$6 mandir=$7

# meson test points LD_LIBRARY_PATH at the build tree: drop it, so that the
# consumers load the installed libshmring.so (or the subproject's).
unset LD_LIBRARY_PATH

need() { command -v "$1" >/dev/null || { echo "skip: $1 not found"; exit 77; }; }
abs() { case $1 in /*) echo "$1" ;; *) echo "$prefix/$1" ;; esac; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shmring-consumer-$mode.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
cp "$here/consumer.cpp" "$tmp/"

install_to_destdir() {
  meson install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; exit 1; }
  root_prefix="$tmp/root$prefix"
  root_libdir="$tmp/root$(abs "$libdir")"
  shmrun="$tmp/root$(abs "$bindir")/shmrun"
  test -x "$shmrun" || { echo "no shmrun in the install ($shmrun)"; exit 1; }
  if command -v help2man >/dev/null; then
    page="$tmp/root$(abs "$mandir")/man1/shmrun.1"
    test -f "$page" || { echo "no man page in the install ($page)"; exit 1; }
    if command -v man >/dev/null; then
      # Read the whole output before grep: with pipefail, `man | grep -q` fails
      # whenever grep exits on its match before man has written its last line.
      shown=$(MANWIDTH=100 man -l "$page" 2>/dev/null)
      grep -q -- "--tag-output" <<<"$shown" ||
        { echo "man -l $page does not show the options"; exit 1; }
    fi
  fi
}

case $mode in
  cmake)
    need cmake
    install_to_destdir
    test -f "$root_libdir/cmake/shmring/shmringConfig.cmake"
    test -f "$root_libdir/cmake/shmring/shmringConfigVersion.cmake"
    mkdir "$tmp/cmake"
    cp "$here/cmake/CMakeLists.txt" "$tmp/cmake/"
    # find_package must also refuse a version the package does not satisfy.
    cmake -S "$tmp/cmake" -B "$tmp/cmake/build" -DCMAKE_PREFIX_PATH="$root_prefix" \
      -DCMAKE_BUILD_TYPE=Release >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; exit 1; }
    cmake --build "$tmp/cmake/build" >>"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; exit 1; }
    sed -i 's/find_package(shmring 0.1 REQUIRED)/find_package(shmring 0.2 REQUIRED)/' \
      "$tmp/cmake/CMakeLists.txt"
    if cmake -S "$tmp/cmake" -B "$tmp/cmake/build2" -DCMAKE_PREFIX_PATH="$root_prefix" \
      >"$tmp/cmake2.log" 2>&1; then
      echo "find_package(shmring 0.2) accepted version 0.1"; exit 1
    fi
    exe="$tmp/cmake/build/consumer"
    lib_path=""  # CMake gave it a RUNPATH to the imported library's directory
    want="$tmp/root"
    ;;
  pkgconfig)
    need pkg-config
    install_to_destdir
    # The .pc names the final prefix; the sysroot variable maps it into DESTDIR.
    export PKG_CONFIG_PATH="$root_libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$tmp/root"
    flags=$(pkg-config --cflags --libs shmring)
    case "${flags,,}" in *tbb* | *fmt* | *spdlog* | *boost* | *json*) echo "private deps leak: $flags"; exit 1 ;; esac
    # shellcheck disable=SC2086
    ${CXX:-c++} -std=c++20 -o "$tmp/consumer" "$tmp/consumer.cpp" $flags
    exe="$tmp/consumer"
    lib_path=$root_libdir
    want="$tmp/root"
    ;;
  buildtree)
    need pkg-config
    export PKG_CONFIG_PATH="$build/meson-uninstalled"
    flags=$(pkg-config --cflags --libs shmring-uninstalled)
    # shellcheck disable=SC2086
    ${CXX:-c++} -std=c++20 -o "$tmp/consumer" "$tmp/consumer.cpp" $flags \
      -Wl,-rpath,"$build/src"
    if [ -f "$build/meson-uninstalled/shmring-mpi-uninstalled.pc" ]; then
      printf '%s\n' '#include <shmring/mpi.hpp>' \
        'int main(int argc, char** argv) { MPI_Init(&argc, &argv);' \
        '  { shmring::mpi::Communicator c(MPI_COMM_WORLD); } MPI_Finalize(); }' >"$tmp/hier.cpp"
      mpi_flags=$(pkg-config --cflags --libs shmring-mpi-uninstalled)
      # shellcheck disable=SC2086
      ${CXX:-c++} -std=c++20 -o "$tmp/hier" "$tmp/hier.cpp" $mpi_flags \
        -Wl,-rpath,"$build/src/mpi" -Wl,-rpath,"$build/src" ||
        { echo "the MPI layer does not link from the build tree: $mpi_flags"; exit 1; }
      # Not piped into grep -q, for the reason given for man above.
      loaded=$(LD_TRACE_LOADED_OBJECTS=1 "$tmp/hier")
      grep -q "$build/src/mpi/libshmring_mpi" <<<"$loaded" ||
        { echo "the MPI program does not load libshmring_mpi from $build/src/mpi"; exit 1; }
    fi
    exe="$tmp/consumer"
    lib_path=""
    want="$build/src"
    shmrun="$build/tools/shmrun"
    ;;
  subproject)
    need meson
    need ninja
    mkdir -p "$tmp/meson/subprojects"
    cp "$here/meson/meson.build" "$tmp/meson/"
    ln -s "$src" "$tmp/meson/subprojects/shmring"
    (cd "$tmp/meson" && meson setup build --force-fallback-for=shmring >"$tmp/setup.log" 2>&1) ||
      { cat "$tmp/setup.log"; exit 1; }
    ninja -C "$tmp/meson/build" >"$tmp/ninja.log" 2>&1 || { cat "$tmp/ninja.log"; exit 1; }
    exe="$tmp/meson/build/consumer"
    lib_path=""  # meson's build RUNPATH points at the subproject's library
    want="$tmp/meson/build/subprojects/shmring"
    shmrun="$build/tools/shmrun"
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac

# Both ranks print their line (the two may share a line of the pipe); any
# failure or a missing report fails the test.
# The consumer must load the library it was built against.
loaded=$(LD_LIBRARY_PATH=$lib_path LD_TRACE_LOADED_OBJECTS=1 "$exe" | grep libshmring || true)
echo "loads:$loaded"
case $loaded in
  *"$want"*) ;;
  *) echo "the $mode consumer does not load libshmring from $want"; exit 1 ;;
esac
out=$(LD_LIBRARY_PATH=$lib_path "$shmrun" -n 2 --timeout 120 -- "$exe")
echo "$out"
for r in 0 1; do
  grep -q "consumer: rank $r of 2 ok" <<<"$out" || { echo "rank $r did not report ok"; exit 1; }
done
