#!/usr/bin/env bash
# Qualcomm's x86_64 QNN libraries (the HTP simulator) for qnn://htp-sim; prints their folder last.
#
#   install_htp_sim.sh [--python PY]     # -> ${BUNDLERUN_CACHE:-~/.cache/bundlerun}/qnn/2.49.40/
#
# Why this wheel: Qualcomm publishes no QNN SDK on a package registry, but the PyPI wheel
# onnxruntime-qnn ships QNN's x86_64 libQnnHtp.so (HTP compiler + simulator) and libQnnSystem.so
# with the libc++ they need. Only 2.5.0 (QNN 2.49.40) matches the executorch==1.5.1 wheel: its
# HTP device custom config is laid out as in the QNN 2.37 headers 1.5.1 was compiled against;
# 2.3.0/2.4.0/2.6.0/2.7.0 read the SoC as 0 (`unknown custom config socModel 0`, error 14001)
# (../shared/third_party/SOURCES.md, "Facts checked on 2026-12-01").
#
# The wheel is fetched with pip (hash pinned below), its qnn_version checked, and only the five
# libraries (+ Qualcomm's licence) are unpacked, into a folder named by the QNN version with
# qnn.json recording the wheel's hash and each file's. They carry Qualcomm's licence
# (Qualcomm_LICENSE.pdf): installed on each machine from PyPI, never committed.
# Idempotent: a second call checks qnn.json and returns at once.
set -euo pipefail
SCRIPT="install_htp_sim.sh"
PY="${PYTHON:-python3}"
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY="$2"; shift 2;;
    -h|--help) sed -n '2,17p' "$0"; exit 0;;
    *) echo "$SCRIPT: unknown option $1 (see --help)" >&2; exit 2;;
  esac
done

WHEEL_VERSION="2.5.0"
QNN_VERSION="2.49.40"
WHEEL_FILE="onnxruntime_qnn-2.5.0-cp311-cp311-manylinux_2_35_x86_64.whl"
WHEEL_SHA256="6a6a8db1e36584b4ac2e5ba356f4943b1916303b7f1fd44e27f4ca056f145dfe"
LIBS=(onnxruntime_qnn/libQnnHtp.so onnxruntime_qnn/libQnnSystem.so
      onnxruntime_qnn.libs/libc++-71bc274c.so.1.0 onnxruntime_qnn.libs/libc++abi-0539aa51.so.1.0
      onnxruntime_qnn.libs/libunwind-6b740a46.so.1.0)

BUNDLERUN_CACHE="${BUNDLERUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bundlerun}"
DEST="$BUNDLERUN_CACHE/qnn/$QNN_VERSION"
die() { echo "$SCRIPT: $*" >&2; exit 2; }

# The folder is ready when qnn.json names this wheel and every library has the size it recorded.
ready() {
  [ -f "$DEST/qnn.json" ] || return 1
  "$PY" - "$DEST" "$WHEEL_SHA256" <<'EOF'
import json, pathlib, sys
dest, sha = pathlib.Path(sys.argv[1]), sys.argv[2]
rec = json.loads((dest / "qnn.json").read_text())
ok = rec.get("wheel_sha256") == sha and all((dest / "lib" / f["name"]).is_file()
        and (dest / "lib" / f["name"]).stat().st_size == f["size"] for f in rec.get("files", []))
sys.exit(0 if ok and rec.get("files") else 1)
EOF
}

mkdir -p "$BUNDLERUN_CACHE/qnn"
(
  flock 9
  if ready; then exit 0; fi
  command -v "$PY" >/dev/null 2>&1 || die "no python at $PY (pass --python or set PYTHON)"
  work="$(mktemp -d "$BUNDLERUN_CACHE/qnn/.install.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  # The wheel is for CPython 3.11 only: name the platform so any interpreter fetches this one file,
  # and let pip check the hash as it downloads (--require-hashes).
  echo "onnxruntime-qnn==$WHEEL_VERSION --hash=sha256:$WHEEL_SHA256" > "$work/req.txt"
  "$PY" -m pip download -q --no-deps --require-hashes --only-binary=:all: --python-version 3.11 \
      --implementation cp --abi cp311 --platform manylinux_2_35_x86_64 -r "$work/req.txt" -d "$work/dl" >&2 \
    || die "pip could not download onnxruntime-qnn==$WHEEL_VERSION from PyPI (see above)"
  wheel="$work/dl/$WHEEL_FILE"
  [ -f "$wheel" ] || die "pip did not produce $WHEEL_FILE"
  got="$(sha256sum "$wheel" | cut -d' ' -f1)"
  [ "$got" = "$WHEEL_SHA256" ] || die "$WHEEL_FILE has sha256 $got, expected $WHEEL_SHA256"
  "$PY" - "$wheel" "$work/out" "$QNN_VERSION" "$WHEEL_SHA256" "${LIBS[@]}" <<'EOF' || exit 2
import hashlib, json, pathlib, re, sys, zipfile, datetime
wheel, out, want, sha, names = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
with zipfile.ZipFile(wheel) as zf:
    info = zf.read("onnxruntime_qnn/build_and_package_info.py").decode()
    m = re.search(r"qnn_version\s*=\s*['\"]([^'\"]+)", info)
    if not m or m.group(1) != want:
        sys.exit(f"install_htp_sim.sh: the wheel says qnn_version {m.group(1) if m else '?'}, expected {want}")
    (out / "lib").mkdir(parents=True)
    files = []
    for name in names:
        data = zf.read(name)
        target = out / "lib" / pathlib.PurePosixPath(name).name
        target.write_bytes(data)
        target.chmod(0o755)
        files.append({"name": target.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    (out / "Qualcomm_LICENSE.pdf").write_bytes(zf.read("onnxruntime_qnn/Qualcomm_LICENSE.pdf"))
record = {"kind": "qnn-htp-sim", "qnn_version": want, "wheel": "onnxruntime-qnn==2.5.0",
          "wheel_file": pathlib.Path(wheel).name, "wheel_sha256": sha, "files": files,
          "licence": "Qualcomm_LICENSE.pdf (Qualcomm's own licence: never commit these files)",
          "installed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
(out / "qnn.json").write_text(json.dumps(record, indent=2) + "\n")
EOF
  rm -rf "$DEST"
  mv "$work/out" "$DEST"
) 9>"$BUNDLERUN_CACHE/qnn/.lock"
ready || die "$DEST is incomplete after installing (qnn.json does not match its files)"
echo "$DEST"
