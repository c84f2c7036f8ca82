#!/usr/bin/env bash
# Build a bootable guest that runs memtrace's shipped objects on Debian's
# current bookworm kernel for ARCH, against a workload with known truth.
#   tests/kernels/build_guest.sh ARCH OUT [CACHE]      ARCH: x86 | arm64
# PYTHON: the interpreter with the project installed (default ./.venv/bin/python).
# Writes OUT/vmlinuz, OUT/initrd.gz and OUT/kernel (the package it booted).
set -euo pipefail
arch=$1; out=$2; cache=${3:-$out/cache}
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd)
case $arch in
  x86) darch=amd64; cc=gcc; libs="-lbpf -lelf -lz" ;;
  arm64) darch=arm64; cc=aarch64-linux-gnu-gcc; libs="-lbpf -lelf -lz -lzstd" ;;
  *) echo "unknown arch $arch" >&2; exit 2 ;;
esac
other=$([ $arch = x86 ] && echo arm64 || echo x86)
mkdir -p "$out" "$cache"

# The kernel the bookworm meta package points at today, and busybox.
kpkg=$(apt-cache depends "linux-image-cloud-$darch:$darch" | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
kpkg=${kpkg%:$darch}
(
  cd "$cache"
  ls ${kpkg}_*_$darch.deb >/dev/null 2>&1 || apt-get download -q "$kpkg:$darch" >/dev/null 2>&1
  ls busybox-static_*_$darch.deb >/dev/null 2>&1 || apt-get download -q "busybox-static:$darch" >/dev/null 2>&1
)
rm -rf "$out/x" "$out/root" && mkdir -p "$out/x" "$out/root"/{bin,proc,sys,dev,tmp}
dpkg-deb -x "$(ls "$cache"/${kpkg}_*_$darch.deb | head -1)" "$out/x"
cp "$(ls "$out"/x/boot/vmlinuz-* | head -1)" "$out/vmlinuz"
dpkg-deb -x "$(ls "$cache"/busybox-static_*_$darch.deb | head -1)" "$out/x"
echo "$kpkg $(dpkg-deb -f "$(ls "$cache"/${kpkg}_*_$darch.deb | head -1)" Version)" > "$out/kernel"

r=$out/root
cp "$out/x/bin/busybox" "$r/bin/busybox"
for t in sh mount poweroff echo uname cat; do ln -sf busybox "$r/bin/$t"; done
fx=$repo/tests/fixtures
$cc -O2 -Wall -fno-ipa-icf -fno-inline -static -DFAKE_DIRECT -I "$fx" -o "$r/workload" \
  "$fx/workload.c" "$fx/runtime.c" "$fx/driver.c" -lpthread
# An NCCL rank calling the test NCCL directly: the communicator probes' arguments on this arch.
$cc -O2 -Wall -fno-ipa-icf -fno-inline -static -DNCCL_DIRECT -I "$fx" -o "$r/nccl_comm" \
  "$fx/nccl_comm.c" "$fx/nccl.c" 2>/dev/null
$cc -O2 -static -I "$repo/bpf" -o "$r/harness" "$here/harness.c" $libs 2>/dev/null
cp "$repo/memtrace/bpf/memtrace.$arch.bpf.o" "$r/right.bpf.o"
cp "$repo/memtrace/bpf/memtrace.$other.bpf.o" "$r/wrong.bpf.o"
for s in sched nccl; do cp "$repo/memtrace/bpf/$s.$arch.bpf.o" "$r/$s.bpf.o"; done
PYTHONPATH=$repo "${PYTHON:-$repo/.venv/bin/python}" "$here/plan.py" "$r/workload" /workload > "$r/plan"
PYTHONPATH=$repo "${PYTHON:-$repo/.venv/bin/python}" "$here/plan.py" --nccl "$r/nccl_comm" /nccl_comm > "$r/nccl_plan"
cat > "$r/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tracefs nodev /sys/kernel/tracing
echo "MT-KERNEL $(uname -r) $(uname -m)"
for obj in right wrong; do
  echo "MT-RUN $obj"
  /harness /$obj.bpf.o /plan /workload -n 600 -t 2 -f -s 7
  echo "MT-RUN-END $obj"
done
for s in sched nccl; do /harness --load /$s.bpf.o; done
echo "MT-RUN nccl"
/harness --nccl /nccl.bpf.o /nccl_plan /nccl_comm direct - 1 4
echo "MT-RUN-END nccl"
echo MT-END
poweroff -f
INIT
chmod +x "$r/init"
(cd "$r" && find . | cpio -o -H newc --quiet | gzip -1) > "$out/initrd.gz"
rm -rf "$out/x"
