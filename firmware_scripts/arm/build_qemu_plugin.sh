#!/usr/bin/env bash
# Build bundlerun's QEMU TCG plugin (qemu_plugin/insn_count.c) that counts the guest
# instructions of a whole QEMU session, for the `session_instructions` perf figure of
# qemu://mps3-an547 (issue 17). Cached content-addressed; a second call returns at once.
#
#   build_qemu_plugin.sh                        header from the installed QEMU's Debian source
#   build_qemu_plugin.sh --qemu-src DIR         header from your QEMU source tree (DIR/include/qemu/qemu-plugin.h)
#   build_qemu_plugin.sh --header FILE          an explicit qemu-plugin.h
#   build_qemu_plugin.sh --cached-only          print the cached folder or exit 3; never build
#
# Options: --qemu BIN (default qemu-system-arm), --force, --dry-run.
#
# Why a download: QEMU's plugin API header (qemu-plugin.h) is not in any Debian binary package,
# while Debian's qemu-system-arm is built with plugin support. The header comes from the same
# Debian source release as QEMU 7.2 (qemu_7.2+dfsg.orig.tar.xz, checked against the SHA-256 that
# Debian's .dsc lists), only that one file is extracted. A plugin built against API version 1
# loads in QEMU 7.2; other QEMU versions: pass their own source with --qemu-src.
#
# After the build the plugin is loaded once by the QEMU it was built for (`-M none`), so a
# plugin the QEMU refuses is caught here and never cached. Output: the last stdout line is the
# folder ($BUNDLERUN_CACHE/qemu-plugins/<key>/ with libinsn_count.so and plugin.json).
set -euo pipefail

ET_SCRIPT_NAME="build_qemu_plugin.sh"
here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/et_sources.sh
source "$here/../lib/et_sources.sh"
die() { et_die "$*"; }

DEBIAN_ORIG_URL="http://deb.debian.org/debian/pool/main/q/qemu/qemu_7.2+dfsg.orig.tar.xz"
DEBIAN_ORIG_SHA256="91aca71520040edc40b8d437aa3004dae614f58e286cf653ee8996c07af2962f"

qemu_src=""
header=""
qemu_bin="qemu-system-arm"
cached_only=false
force=false
dry_run=false
need_value() { [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value (see --help)"; }
while (($#)); do
  arg="$1"
  if [[ "$arg" == --*=* ]]; then set -- "${arg%%=*}" "${arg#*=}" "${@:2}"; arg="$1"; fi
  case "$arg" in
    --qemu-src) need_value "$@"; qemu_src="$2"; shift 2 ;;
    --header) need_value "$@"; header="$2"; shift 2 ;;
    --qemu) need_value "$@"; qemu_bin="$2"; shift 2 ;;
    --cached-only) cached_only=true; shift ;;
    --force) force=true; shift ;;
    --dry-run) dry_run=true; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$arg' (see --help)" ;;
  esac
done

qemu_path="$(command -v "$qemu_bin" || true)"
[[ -n "$qemu_path" ]] || die "$qemu_bin not found (apt-get install qemu-system-arm)"
qemu_version="$("$qemu_path" --version | sed -n 1,1p)"
command -v gcc >/dev/null 2>&1 || die "gcc not found (apt-get install gcc)"
compiler="$(gcc --version | sed -n 1,1p)"

if [[ -n "$qemu_src" ]]; then
  header="$qemu_src/include/qemu/qemu-plugin.h"
  [[ -f "$header" ]] || die "$qemu_src has no include/qemu/qemu-plugin.h"
elif [[ -n "$header" ]]; then
  [[ -f "$header" ]] || die "header not found: $header"
fi
header_id="${header:-debian:$DEBIAN_ORIG_SHA256}"
key="$(et_cache_key "qemu-insn-plugin-v1" "$here/qemu_plugin/insn_count.c" "${header:-$header_id}" \
  "$compiler" "$qemu_version")"
out="$BUNDLERUN_CACHE/qemu-plugins/$key"

if $dry_run; then
  echo "# $qemu_version; header: $header_id; $compiler"
  echo "$out"
  exit 0
fi
if ! $force && [[ -f "$out/plugin.json" && -f "$out/libinsn_count.so" ]]; then
  echo "$out"
  exit 0
fi
$cached_only && exit 3

mkdir -p "$BUNDLERUN_CACHE/qemu-plugins"
tmp="$(mktemp -d "$BUNDLERUN_CACHE/qemu-plugins/.partial.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
if [[ -z "$header" ]]; then
  command -v curl >/dev/null 2>&1 || die "curl not found (apt-get install curl), or pass --qemu-src/--header"
  echo "build_qemu_plugin.sh: fetching qemu-plugin.h from $DEBIAN_ORIG_URL" >&2
  curl -fsSL --retry 3 -o "$tmp/qemu.orig.tar.xz" "$DEBIAN_ORIG_URL" || die "cannot download $DEBIAN_ORIG_URL"
  got="$(sha256sum "$tmp/qemu.orig.tar.xz" | cut -c1-64)"
  [[ "$got" == "$DEBIAN_ORIG_SHA256" ]] || die "$DEBIAN_ORIG_URL has SHA-256 $got, not Debian's $DEBIAN_ORIG_SHA256"
  tar -xJf "$tmp/qemu.orig.tar.xz" -C "$tmp" --wildcards '*/include/qemu/qemu-plugin.h' \
    || die "the QEMU source tarball holds no include/qemu/qemu-plugin.h"
  header="$(find "$tmp" -path '*/include/qemu/qemu-plugin.h' | sed -n 1p)"
  rm -f "$tmp/qemu.orig.tar.xz"
fi
mkdir -p "$tmp/include"
cp "$header" "$tmp/include/qemu-plugin.h"
gcc -O2 -Wall -Werror -shared -fPIC -I"$tmp/include" -o "$tmp/libinsn_count.so" "$here/qemu_plugin/insn_count.c" \
  || die "compiling the plugin failed"

# QEMU loads it (API version accepted): a paused `-M none` QEMU stays up until the timeout ends it
# (exit 124); a refused plugin ends QEMU at once with its reason.
rc=0
(cd "$tmp" && timeout 3 "$qemu_path" -M none -nographic -monitor none -serial none -S \
  -plugin "$tmp/libinsn_count.so" -d plugin -D "$tmp/probe.log" </dev/null >/dev/null 2>"$tmp/probe.err") || rc=$?
if ((rc != 124)); then
  die "$qemu_version does not load the plugin (exit $rc): $(head -n 1 "$tmp/probe.err") (build against its own source: --qemu-src DIR)"
fi

sha="$(sha256sum "$tmp/libinsn_count.so" | cut -c1-64)"
cat >"$tmp/plugin.json" <<JSON
{
  "kind": "qemu-tcg-plugin",
  "plugin": "$out/libinsn_count.so",
  "sha256": "$sha",
  "counts": "guest instructions of the whole session (inline, per translated block)",
  "line": "bundlerun-insn-count: insns=N",
  "qemu": "$qemu_path",
  "qemu_version": "$qemu_version",
  "header": "$header_id",
  "compiler": "$compiler",
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
JSON
rm -rf "$tmp/include" "$tmp/probe.log" "$tmp/probe.err" "$tmp"/qemu-*
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
