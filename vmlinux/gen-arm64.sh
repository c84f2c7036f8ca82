#!/usr/bin/env bash
# Print an arm64 vmlinux.h generated from the BTF inside Debian's arm64 cloud
# kernel, so the header is reproducible without an arm64 machine.
#   vmlinux/gen-arm64.sh > vmlinux/arm64/vmlinux.h
# Needs: apt with arm64 enabled (dpkg --add-architecture arm64), bpftool, python3.
set -euo pipefail
PKG=${PKG:-linux-image-6.1.0-56-cloud-arm64}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
deb=${DEB:-}
if [ -z "$deb" ]; then
  (cd "$work" && apt-get download "$PKG:arm64" >/dev/null 2>&1)
  deb=$(ls "$work"/*.deb)
fi
dpkg-deb -x "$deb" "$work/x"
img=$(ls "$work"/x/boot/vmlinuz-*)
python3 - "$img" "$work/btf" <<'PY'
import gzip, struct, sys
data = open(sys.argv[1], "rb").read()
if data[:2] == b"\x1f\x8b":
    data = gzip.decompress(data)
pos = 0
while True:
    pos = data.find(b"\x9f\xeb\x01\x00", pos)
    if pos < 0:
        sys.exit("no BTF blob in the kernel image")
    hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<5I", data, pos + 4)
    if hdr_len == 24 and type_len > 1 << 20:
        end = pos + hdr_len + max(type_off + type_len, str_off + str_len)
        open(sys.argv[2], "wb").write(data[pos:end])
        break
    pos += 4
PY
bpftool btf dump file "$work/btf" format c
