#!/bin/sh
# The installed `lockwatch` runs from wherever it is installed: installed
# into a fresh DESTDIR (a prefix no loader path knows), it finds the
# library installed beside it, without LD_LIBRARY_PATH. Argument: the build
# directory.
set -eu
build=$1
dest=$(mktemp -d "${TMPDIR:-/tmp}/lockwatch-install-XXXXXX")
trap 'rm -rf "$dest"' EXIT
meson install -C "$build" --no-rebuild --quiet --destdir "$dest" --tags runtime >/dev/null
bin=$(find "$dest" -path '*/bin/lockwatch' -type f)
[ -n "$bin" ] || { echo "no bin/lockwatch under $dest"; exit 1; }
lib=$(env -u LD_LIBRARY_PATH ldd "$bin" | awk '/liblockwatch/ { print $3 }')
case "$lib" in
  "$dest"/*) ;;
  *) echo "bin/lockwatch loads liblockwatch from '$lib', not from its own prefix under $dest"; exit 1 ;;
esac
env -u LD_LIBRARY_PATH "$bin" --version
