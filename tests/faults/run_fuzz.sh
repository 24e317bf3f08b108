#!/bin/sh
# Builds tests/faults/fuzz_header.cpp with clang's libFuzzer (+ASan, UBSan) and
# runs it for a bounded time. Exit 77 (skipped) when clang or libFuzzer is
# missing. Usage: run_fuzz.sh SOURCE_ROOT BUILD_DIR [SECONDS]
src=${1:?source root}
out=${2:?build dir}
secs=${3:-${SHMRING_FUZZ_SECONDS:-20}}
cxx=${CLANGXX:-clang++}
command -v "$cxx" >/dev/null 2>&1 || { echo "skipped: $cxx not found"; exit 77; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
bin="$out/fuzz_header"
if ! "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$src/src" -I"$src/include" "$src/tests/faults/fuzz_header.cpp" \
    "$src/src/transport/header_check.cpp" -lfmt \
    -o "$bin" 2>"$out/fuzz_build.log"; then
  if grep -qi "fuzzer" "$out/fuzz_build.log"; then
    echo "skipped: libFuzzer not available (apt-get install libclang-rt-14-dev)"
    cat "$out/fuzz_build.log"; exit 77
  fi
  cat "$out/fuzz_build.log"; exit 1
fi
corpus="$out/fuzz_corpus"
mkdir -p "$corpus"
cd "$out" || exit 1
exec "$bin" -max_total_time="$secs" -max_len=256 -print_final_stats=1 "$corpus"
