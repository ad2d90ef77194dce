#!/usr/bin/env bash
# Builds the cargo-fuzz targets (AddressSanitizer; RUSTC_BOOTSTRAP lets the
# stable toolchain take -Zsanitizer) and runs each for FUZZ_SECONDS.
# Fails on any crash, leak, timeout or out-of-memory report.
#
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_TARGETS   space-separated subset (default: every target)
#   FUZZ_JOBS      parallel libFuzzer jobs per target (default 1)
#   FUZZ_ARGS      extra libFuzzer flags
set -euo pipefail

cd "$(dirname "$0")/../fuzz"
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_JOBS="${FUZZ_JOBS:-1}"
export RUSTC_BOOTSTRAP=1
# Log directories built by the targets live on tmpfs when there is one.
if [[ -z "${FISSIONLOG_FUZZ_TMP:-}" && -d /dev/shm ]]; then
    export FISSIONLOG_FUZZ_TMP=/dev/shm
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked || cargo install cargo-fuzz
fi

sanitizer=()
if ! cargo fuzz build >/dev/null 2>build-asan.log; then
    echo "AddressSanitizer build failed (see fuzz/build-asan.log); building without a sanitizer" >&2
    sanitizer=(-s none)
    cargo fuzz build "${sanitizer[@]}"
fi

targets="${FUZZ_TARGETS:-$(cargo fuzz list)}"
parallel=""
if ((FUZZ_JOBS > 1)); then
    # Fork mode: crashes are collected, the run goes on, the exit code tells.
    parallel="-fork=$FUZZ_JOBS"
fi
failed=()
for t in $targets; do
    mkdir -p "corpus/$t" "artifacts/$t"
    # Run on a scratch copy of the committed seeds so the new inputs the
    # fuzzer finds do not pile up in the repository.
    work="$(mktemp -d)"
    cp -r "corpus/$t/." "$work/"
    echo "== fuzzing $t for ${FUZZ_SECONDS}s"
    log="artifacts/$t/fuzz.log"
    # shellcheck disable=SC2086
    if ! cargo fuzz run "${sanitizer[@]}" "$t" "$work" -- \
        -max_total_time="$FUZZ_SECONDS" -timeout=20 -rss_limit_mb=4096 \
        -print_final_stats=1 ${parallel} ${FUZZ_ARGS:-} \
        >"$log" 2>&1; then
        failed+=("$t")
        tail -n 40 "$log" >&2
    fi
    grep -E "^#[0-9]+.*(DONE|cov:)" "$log" | tail -n 1 || true
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" || true
    rm -rf "$work"
done

if ((${#failed[@]})); then
    echo "fuzzing found crashes in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzzing: no crash in ${targets//$'\n'/ }"
