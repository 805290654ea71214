#!/usr/bin/env bash
# Every prerequisite of the build and the test tiers, checked and (where it can) installed,
# before anything needs it. `make demo`, `make test` and `.ci/run` run it first.
#
#   scripts/setup.sh           (`make setup`)  check everything, install what is missing and
#                              can be installed, say what it installed; for what it cannot
#                              install, exit 1 with one line naming the command that would
#                              (one line for all the Debian packages it may not install)
#   scripts/setup.sh --check   (`make doctor`) the same checks, read-only, as a table
#                              (found / missing / how to get it); exit 1 when one is missing
#   scripts/setup.sh --demo    what `make demo` needs: the image's prerequisites only where it
#                              runs a real node (elsewhere the controller runs as a process)
#
# The list of checks is `define_checks` below, the one list both modes read. What it covers:
#   - rustup and the toolchain rust-toolchain.toml pins, with its components and targets and
#     the host's musl target (`make image-static`). rustup adds a pinned toolchain's targets
#     only when it installs that toolchain itself, so a toolchain installed earlier lacks the
#     musl target until someone adds it (issue 36).
#   - the musl C compiler cc-rs looks for (<arch>-linux-musl-gcc, Debian's musl-tools), which
#     `make image-static` needs long before the real-node tier starts;
#   - the commands the tests and scripts run (cc, readelf, python3, openssl, curl, setsid,
#     flock, sha256sum, git, make);
#   - Go, at least the newest `go` line of tests/cluster/*/go.mod (the builds run with
#     GOTOOLCHAIN=local, so an older Go refuses them);
#   - /usr/bin/time (`make detect-rss` reads the peak RSS from it);
#   - where this machine can run the real node (root on Linux: tc_node_host_supported), `ip`
#     and the Debian packages the node needs (TC_NODE_APT in tests/cluster/node.sh).
# Installs, in this order: `rustup toolchain install`, `rustup component add`, `rustup target
# add`, then one `apt-get update` and one `apt-get install` of every missing Debian package
# (root and apt-get only). Their output goes to the log ($HWACCEL_SETUP_LOG, default
# target/setup.log). Rustup itself and Go it never installs: it names the command.
#
# What the checks see can be redirected, so that tests/setup_script.rs runs it against
# stand-ins without touching this machine: the commands come from PATH, and
#   HWACCEL_SETUP_AS_ROOT=1|0    whether apt-get may be run (default: uid 0)
#   HWACCEL_SETUP_REAL_NODE=1|0  whether the real-node tier can run here (default:
#                                tc_node_host_supported, which may load br_netfilter as the
#                                tier does)
#   HWACCEL_SETUP_FS_ROOT        prefixed to the files checked by path (/usr/bin/time)
#   HWACCEL_SETUP_GO_DIRS        where Go is looked for after PATH (default: the directories
#                                tests/cluster/build.sh looks in)
#   HWACCEL_SETUP_LOG            the installers' log
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

MODE=install FOR=test
for a in "$@"; do
  case $a in
    --check) MODE=check ;;
    --demo) FOR=demo ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "setup: unknown argument '$a' (usage: scripts/setup.sh [--check] [--demo])" >&2; exit 2 ;;
  esac
done

LOG=${HWACCEL_SETUP_LOG:-$ROOT/target/setup.log}
ARCH=$(uname -m)
OS=$(uname -s)

say() { echo "setup: $*"; }
# fail LINE: the one line a failed run prints (stderr), then exit 1.
fail() { echo "setup: error: $*" >&2; exit 1; }

# ---------------------------------------------------------------- what the tree pins

# toml_list KEY: the quoted strings of `KEY = [...]` in rust-toolchain.toml.
toml_list() { sed -n "s/^$1 *= *\[\(.*\)\]/\1/p" rust-toolchain.toml | grep -o '"[^"]*"' | tr -d '"' || true; }
CHANNEL=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
[ -n "$CHANNEL" ] || fail "rust-toolchain.toml names no channel"
MUSL_TARGET=$ARCH-unknown-linux-musl
# The targets rust-toolchain.toml lists, and the one `make image-static` builds for here.
RUST_TARGETS=$({ toml_list targets; echo "$MUSL_TARGET"; } | awk '!seen[$0]++')
RUST_COMPONENTS=$(toml_list components)
# The newest `go` directive of the Go modules tests/cluster builds.
GO_MIN=$(sed -n 's/^go \([0-9.]*\)$/\1/p' tests/cluster/*/go.mod | sort -V | tail -n 1)
[ -n "$GO_MIN" ] || fail "no 'go' line in tests/cluster/*/go.mod"
# The real node's Debian packages, from the tier itself.
# shellcheck source=../tests/cluster/lib.sh
. tests/cluster/lib.sh
# shellcheck source=../tests/cluster/node.sh
. tests/cluster/node.sh

if [ -n "${HWACCEL_SETUP_AS_ROOT:-}" ]; then AS_ROOT=$HWACCEL_SETUP_AS_ROOT
elif [ "$(id -u)" = 0 ]; then AS_ROOT=1; else AS_ROOT=0; fi
if [ -n "${HWACCEL_SETUP_REAL_NODE:-}" ]; then
  REAL_NODE=$HWACCEL_SETUP_REAL_NODE
  NODE_WHY="HWACCEL_SETUP_REAL_NODE=$REAL_NODE"
else
  NODE_WHY=$(tc_node_host_supported)
  if [ -z "$NODE_WHY" ]; then REAL_NODE=1; else REAL_NODE=0; fi
fi
if command -v apt-get >/dev/null 2>&1 && command -v dpkg-query >/dev/null 2>&1; then APT=1; else APT=0; fi

# ---------------------------------------------------------------- the checks

# One check per row: KIND ARG PACKAGE SCOPE FOR
#   KIND     rustup | toolchain | component | target | cmd (ARG on PATH) | file (ARG, a path,
#            executable) | deb (package ARG installed) | go (ARG = the least version)
#   PACKAGE  the Debian package that provides it, or - (rustup installs it, or nothing can)
#   SCOPE    all; image (`make image-static`: always for `make test`, whose node-test and
#            detect-rss build it, for --demo only where the real node runs); node (only where
#            the real-node tier runs)
#   FOR      what needs it, for the table
C_KIND=() C_ARG=() C_PKG=() C_SCOPE=() C_FOR=()
check() { C_KIND+=("$1") C_ARG+=("$2") C_PKG+=("$3") C_SCOPE+=("$4") C_FOR+=("$5"); }

define_checks() {
  local c t p
  check rustup rustup - all "every cargo build"
  check toolchain "$CHANNEL" - all "rust-toolchain.toml"
  for c in $RUST_COMPONENTS; do check component "$c" - all "make check"; done
  for t in $RUST_TARGETS; do check target "$t" - image "make image-static"; done
  check cmd "$ARCH-linux-musl-gcc" musl-tools image "make image-static (cc-rs)"
  check cmd cc gcc all "the fake NVML library (tests)"
  check cmd readelf binutils all "tests/nvml_glibc.rs"
  check cmd make make all "the Makefile"
  check cmd git git all "scripts/build-static.sh"
  check cmd sha256sum coreutils all "build caches"
  check cmd python3 python3 all "scripts/oci-image.py, tests/cluster"
  check cmd openssl openssl all "tests/cluster (PKI)"
  check cmd curl curl all "tests/cluster"
  check cmd setsid util-linux all "tests/cluster"
  check cmd flock util-linux all "tests/cluster"
  check go "$GO_MIN" - all "tests/cluster (the control plane)"
  check file /usr/bin/time time image "make detect-rss (peak RSS)"
  check cmd ip iproute2 node "the real-node tier"
  for p in "${TC_NODE_APT[@]}"; do
    # musl-tools is a check of the build above (its compiler); the node uses it too.
    [ "$p" = musl-tools ] || check deb "$p" "$p" node "the real-node tier"
  done
}

# ---------------------------------------------------------------- probes

# The lists rustup reports, read once per round (refresh after installing).
RUSTUP_TOOLCHAINS= RUSTUP_COMPONENTS= RUSTUP_TARGETS= TOOLCHAIN_PRESENT=0
refresh_rustup() {
  RUSTUP_TOOLCHAINS= RUSTUP_COMPONENTS= RUSTUP_TARGETS= TOOLCHAIN_PRESENT=0
  command -v rustup >/dev/null 2>&1 || return 0
  RUSTUP_TOOLCHAINS=$(rustup toolchain list 2>/dev/null | awk '{print $1}')
  if awk -v ch="$CHANNEL" '$1 == ch || index($1, ch "-") == 1 { found = 1 } END { exit !found }' \
    <<<"$RUSTUP_TOOLCHAINS"; then
    TOOLCHAIN_PRESENT=1
    RUSTUP_COMPONENTS=$(rustup component list --installed --toolchain "$CHANNEL" 2>/dev/null || true)
    RUSTUP_TARGETS=$(rustup target list --installed --toolchain "$CHANNEL" 2>/dev/null || true)
  fi
}

# find_go: the go binary (PATH, then the directories build.sh looks in), or nothing.
find_go() {
  local d
  if command -v go >/dev/null 2>&1; then command -v go; return; fi
  for d in ${HWACCEL_SETUP_GO_DIRS-/usr/local/go/bin $HOME/go/bin $HOME/sdk/go/bin}; do
    if [ -x "$d/go" ]; then echo "$d/go"; return; fi
  done
}

# probe I: 0 when check I holds; DETAIL says what was found (or why it is missing).
DETAIL=
probe() {
  local i=$1 arg=${C_ARG[$1]} go version
  DETAIL=
  case ${C_KIND[$i]} in
    rustup) command -v rustup >/dev/null 2>&1 && DETAIL=$(command -v rustup) ;;
    toolchain) [ $TOOLCHAIN_PRESENT = 1 ] ;;
    component) awk -v c="$arg" '$1 == c || index($1, c "-") == 1 { found = 1 } END { exit !found }' \
      <<<"$RUSTUP_COMPONENTS" ;;
    target) grep -qxF -- "$arg" <<<"$RUSTUP_TARGETS" ;;
    cmd) command -v "$arg" >/dev/null 2>&1 && DETAIL=$(command -v "$arg") ;;
    file) [ -x "${HWACCEL_SETUP_FS_ROOT:-}$arg" ] ;;
    deb) [ $APT = 1 ] && dpkg-query -W -f='${Status}' "$arg" 2>/dev/null | grep -q 'ok installed' ;;
    go)
      go=$(find_go)
      [ -n "$go" ] || return 1
      version=$("$go" env GOVERSION 2>/dev/null || true)
      DETAIL="$version $go"
      case $version in
        go[0-9]*) version=${version#go}; version=${version%%[!0-9.]*} ;;
        *) return 0 ;; # a development build: newer than any release it could be compared with
      esac
      [ "$(printf '%s\n%s\n' "$arg" "$version" | sort -V | head -n 1)" = "$arg" ] ||
        { DETAIL="$DETAIL, too old"; return 1; }
      ;;
  esac
}

needed() {
  case ${C_SCOPE[$1]} in
    all) return 0 ;;
    image) [ $FOR = test ] || [ "$REAL_NODE" = 1 ] ;;
    node) [ "$REAL_NODE" = 1 ] ;;
  esac
}

# how I: the command that gets check I (what this script runs, or what to run by hand).
how() {
  local i=$1 arg=${C_ARG[$1]} pkg=${C_PKG[$1]} go_os go_arch
  case ${C_KIND[$i]} in
    rustup) echo "curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain none" ;;
    toolchain) echo "rustup toolchain install $CHANNEL --profile minimal" ;;
    component) echo "rustup component add --toolchain $CHANNEL $arg" ;;
    target) echo "rustup target add --toolchain $CHANNEL $arg" ;;
    cmd | file | deb)
      if [ $APT = 1 ]; then
        if [ "$AS_ROOT" = 1 ]; then echo "apt-get install $pkg"; else echo "sudo apt-get install $pkg"; fi
      else
        echo "install $pkg (Debian's name) with this system's package manager"
      fi
      ;;
    go)
      go_os=$(tr '[:upper:]' '[:lower:]' <<<"$OS")
      case $ARCH in x86_64) go_arch=amd64 ;; aarch64 | arm64) go_arch=arm64 ;; *) go_arch=$ARCH ;; esac
      echo "rm -rf /usr/local/go && curl -fsSL https://go.dev/dl/go$arg.$go_os-$go_arch.tar.gz | tar -C /usr/local -xz"
      ;;
  esac
}

label() {
  case ${C_KIND[$1]} in
    rustup) echo "rustup" ;;
    toolchain) echo "rust toolchain $CHANNEL" ;;
    component) echo "rust component ${C_ARG[$1]}" ;;
    target) echo "rust target ${C_ARG[$1]}" ;;
    cmd | file) echo "${C_ARG[$1]} (${C_PKG[$1]})" ;;
    deb) echo "${C_ARG[$1]} (deb)" ;;
    go) echo "go >= ${C_ARG[$1]}" ;;
  esac
}

define_checks
refresh_rustup

# ---------------------------------------------------------------- --check: the table

if [ $MODE = check ]; then
  missing=0
  printf '%-44s %-8s %-36s %s\n' CHECK STATUS "NEEDED BY" "HOW TO GET IT"
  for i in "${!C_KIND[@]}"; do
    if ! needed "$i"; then status=n/a
    elif probe "$i"; then status=found
    else status=missing; missing=$((missing + 1)); fi
    printf '%-44s %-8s %-36s %s\n' "$(label "$i")" "$status" "${C_FOR[$i]}" "$(how "$i")"
  done
  if [ "$REAL_NODE" = 1 ]; then echo "real node: can run here (make node-test, make demo's pods)"
  else echo "real node: cannot run here ($NODE_WHY): its rows are n/a, the tier is skipped (an error under CI=true)"; fi
  if [ $missing = 0 ]; then echo "all prerequisites found"; exit 0; fi
  echo "$missing missing: 'make setup' installs what rustup and apt-get can"
  exit 1
fi

# ---------------------------------------------------------------- install

INSTALLED=()
mkdir -p "$(dirname "$LOG")"
# run_install WHAT CMD...: run one installer, its output to the log; WHAT goes in the summary
# (empty: nothing to report). A failure is the one error line.
run_install() {
  local what=$1 rc=0; shift
  say "running: $* (output: $LOG)"
  echo "---- $(date -u +%FT%TZ) $*" >>"$LOG"
  DEBIAN_FRONTEND=noninteractive "$@" >>"$LOG" 2>&1 </dev/null || rc=$?
  [ $rc = 0 ] || fail "'$*' failed (exit $rc); its output is in $LOG"
  [ -z "$what" ] || INSTALLED+=("$what")
}

# missing_of KIND: the ARGs (PACKAGEs for cmd/file/deb) of the needed checks of KIND that fail.
missing_of() {
  local i out=()
  for i in "${!C_KIND[@]}"; do
    [ "${C_KIND[$i]}" = "$1" ] && needed "$i" && ! probe "$i" || continue
    case $1 in cmd | file | deb) out+=("${C_PKG[$i]}") ;; *) out+=("${C_ARG[$i]}") ;; esac
  done
  [ ${#out[@]} = 0 ] || printf '%s\n' "${out[@]}" | awk '!seen[$0]++'
}

# Rust first (a toolchain before its components and targets), then Debian packages.
if command -v rustup >/dev/null 2>&1; then
  if [ $TOOLCHAIN_PRESENT = 0 ]; then
    run_install "rust toolchain $CHANNEL" rustup toolchain install "$CHANNEL" --profile minimal
    refresh_rustup
  fi
  if [ $TOOLCHAIN_PRESENT = 1 ]; then
    mapfile -t components < <(missing_of component)
    mapfile -t targets < <(missing_of target)
    if [ ${#components[@]} -gt 0 ]; then
      run_install "rust components ${components[*]}" rustup component add --toolchain "$CHANNEL" "${components[@]}"
    fi
    if [ ${#targets[@]} -gt 0 ]; then
      run_install "rust targets ${targets[*]}" rustup target add --toolchain "$CHANNEL" "${targets[@]}"
    fi
    [ $((${#components[@]} + ${#targets[@]})) = 0 ] || refresh_rustup
  fi
fi

mapfile -t packages < <({ missing_of cmd; missing_of file; missing_of deb; } | awk '!seen[$0]++')
if [ ${#packages[@]} -gt 0 ] && [ $APT = 1 ] && [ "$AS_ROOT" = 1 ]; then
  run_install "" apt-get update -q
  run_install "Debian packages ${packages[*]}" apt-get install -y -q --no-install-recommends "${packages[@]}"
fi

# What is still missing is what this script cannot install: one line for it, naming the
# command (one for all the Debian packages, one per other check).
left=0 packages=()
for i in "${!C_KIND[@]}"; do
  needed "$i" || continue
  probe "$i" && continue
  left=$((left + 1))
  case ${C_KIND[$i]} in
    cmd | file | deb) if [ $APT = 1 ]; then packages+=("${C_PKG[$i]}"); continue; fi; why= ;;
    go) why=${DETAIL:+ (found $DETAIL)} ;;
    # Without rustup its line below says all: the toolchain comes from the next run.
    toolchain | component | target) command -v rustup >/dev/null 2>&1 || continue; why= ;;
    *) why= ;;
  esac
  then=; [ "${C_KIND[$i]}" != rustup ] || then=", then scripts/setup.sh again"
  echo "setup: error: $(label "$i") missing$why, needed by ${C_FOR[$i]}; run: $(how "$i")$then" >&2
done
if [ ${#packages[@]} -gt 0 ]; then
  mapfile -t packages < <(printf '%s\n' "${packages[@]}" | awk '!seen[$0]++')
  sudo=; [ "$AS_ROOT" = 1 ] || sudo="sudo "
  echo "setup: error: missing Debian packages: ${packages[*]}${sudo:+ (not root)}; run: ${sudo}apt-get install -y ${packages[*]}" >&2
fi
[ $left = 0 ] || exit 1

if [ ${#INSTALLED[@]} -gt 0 ]; then
  say "installed: $(printf '%s; ' "${INSTALLED[@]}" | sed 's/; $//')"
else
  n=0; for i in "${!C_KIND[@]}"; do needed "$i" && n=$((n + 1)); done
  say "all $n prerequisites present, nothing installed"
fi
if [ "$REAL_NODE" = 0 ]; then
  say "the real-node tier cannot run here ($NODE_WHY): its packages were not checked"
fi
