# Unpack Debian packages of ANOTHER suite into a private folder (source it, do not run it).
#
# Why: the Vulkan lane needs tools newer than this system's suite (trixie's glslc, bookworm-backports'
# lavapipe). Installing them would replace system libraries (libc6, libstdc++6, Mesa), so they are
# downloaded with `apt-get download` from a second sources list and unpacked with `dpkg -x`. apt's
# state is private too (Dir::State::Lists, Dir::Cache, an empty dpkg status): the system's apt lists,
# cache and package database are never read for candidates nor written.
#
#   private_apt_unpack SUITE DEST PACKAGE...   # -> DEST/root (the unpacked tree), DEST/packages.txt
#
# DEST/packages.txt records `name version sha256-of-.deb` per package, so whoever caches by content
# can key on exactly what was unpacked. A finished DEST has DEST/.complete; a second call returns at once.

private_apt_die() { echo "${ET_SCRIPT_NAME:-private_apt.sh}: $*" >&2; exit 2; }

private_apt_unpack() {
  local suite="$1" dest="$2"; shift 2
  [ -f "$dest/.complete" ] && return 0
  command -v apt-get >/dev/null || private_apt_die "apt-get not found (a Debian system is needed)"
  command -v dpkg >/dev/null || private_apt_die "dpkg not found"
  local work="$dest.partial" keyring="/usr/share/keyrings/debian-archive-keyring.gpg"
  [ -f "$keyring" ] || private_apt_die "no Debian archive keyring at $keyring (apt-get install debian-archive-keyring)"
  rm -rf "$work"
  mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/debs" "$work/root"
  : > "$work/apt/status"
  printf 'deb [signed-by=%s] http://deb.debian.org/debian %s main\n' "$keyring" "$suite" > "$work/apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
              -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache"
              -o "Dir::State::status=$work/apt/status" -o "APT::Get::List-Cleanup=0"
              -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)" -o "APT::Architecture=amd64" -o "APT::Architectures::=amd64")
  apt-get "${opts[@]}" -qq update >"$work/apt-update.log" 2>&1 \
    || { tail -n 5 "$work/apt-update.log" >&2; private_apt_die "apt-get update of $suite failed (network to deb.debian.org?)"; }
  (cd "$work/debs" && apt-get "${opts[@]}" -qq download "$@") >"$work/apt-download.log" 2>&1 \
    || { tail -n 5 "$work/apt-download.log" >&2; private_apt_die "apt-get download from $suite failed: $*"; }
  local deb name
  : > "$work/packages.txt"
  for deb in "$work"/debs/*.deb; do
    dpkg -x "$deb" "$work/root" || private_apt_die "dpkg -x $deb failed"
    name="$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) $(sha256sum "$deb" | cut -c1-64)"
    echo "$name" >> "$work/packages.txt"
  done
  rm -rf "$work/apt" "$work/debs"  # the lists are ~100 MB; what was unpacked is in packages.txt
  rm -rf "$dest"
  mv "$work" "$dest"
  touch "$dest/.complete"
}
