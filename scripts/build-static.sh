#!/usr/bin/env bash
# Builds the static release binary the default image ships and prints its path:
# `cargo build --release --locked --bin hwaccel --target TARGET`, or the same binary built
# before from the same inputs, kept in a cache keyed by their content.
#
# Usage: scripts/build-static.sh TARGET        (e.g. x86_64-unknown-linux-musl)
#
# Why a cache of its own: cargo decides freshness by file times, and every fresh clone (every
# CI run) has new ones, so the release build (thin LTO over the whole 24 MB binary: 8 min on
# two cores) ran again even when no input had changed (a change to docs, tests or the chart).
# The key is the content of every input of that build (src/, fixtures/ which src/ includes,
# build.rs, Cargo.toml, Cargo.lock, rust-toolchain.toml, scripts/link/, benches/), the
# toolchain's `rustc -vV`, the target, and every RUSTFLAGS/CARGO_* setting that changes code
# generation. Outside a git checkout, with HWACCEL_BUILD_CACHE= (empty) or a cache directory
# it cannot write, it always builds.
# The newest 3 entries are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/build-static.sh TARGET}
built=${CARGO_TARGET_DIR:-$PWD/target}/$target/release/hwaccel
cache_root=${HWACCEL_BUILD_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/hwaccel-operator/static-binary}

build() {
  cargo build --release --locked --bin hwaccel --target "$target" >&2
}

inputs_key() {
  {
    rustc -vV
    echo "target=$target"
    env | grep -E '^(RUSTFLAGS|RUSTC|RUSTC_WRAPPER|CARGO_ENCODED_RUSTFLAGS|CARGO_BUILD_[A-Z_]+|CARGO_PROFILE_[A-Z_]+|CARGO_TARGET_[A-Z0-9_]+_(LINKER|RUSTFLAGS))=' | sort || true
    local files=() file
    while IFS= read -r -d '' file; do
      # A tracked file deleted in the work tree is not an input any more.
      [[ -f $file ]] && files+=("$file")
    done < <(git ls-files -z --cached --others --exclude-standard -- src fixtures build.rs \
      Cargo.toml Cargo.lock rust-toolchain.toml scripts/link benches .cargo | sort -z -u)
    printf '%s\0' "${files[@]}" | xargs -0 -r sha256sum --
  } | sha256sum | cut -c1-32
}

if [[ -z $cache_root ]] || ! git rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
  ! mkdir -p "$cache_root" 2>/dev/null || [[ ! -w $cache_root ]]; then
  build
  echo "$built"
  exit 0
fi

key=$(inputs_key)
entry=$cache_root/$key
if [[ -x $entry/hwaccel ]]; then
  echo "build-static: the inputs are unchanged since an earlier build: $entry/hwaccel" >&2
  touch "$entry"
  echo "$entry/hwaccel"
  exit 0
fi

build
tmp=$(mktemp -d "$cache_root/.new.XXXXXX")
cp "$built" "$tmp/hwaccel"
rm -rf "$entry"
mv "$tmp" "$entry"
# Keep the newest 3 (by last use).
ls -1dt "$cache_root"/*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
echo "$entry/hwaccel"
