#!/bin/busybox sh
# /init of scripts/vm-test-arm64's initramfs (an emulated arm64 machine):
# the static aarch64 installer installs the cross-built arm64 NVIDIA
# artifact into the real Debian arm64 cloud kernel, then `run`s. Each result
# is printed between markers for tests/vm.rs (vm_arm64_results).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run /tmp /var
echo 1 >/proc/sys/kernel/printk

step() {
  name=$1
  shift
  gpu-driver-installer --log-level info --output /tmp/$name.json "$@" 2>/tmp/$name.err
  rc=$?
  echo "@@BEGIN $name rc=$rc@@"
  cat /tmp/$name.json
  echo "@@END $name@@"
  echo "@@BEGIN $name.stderr@@"
  cat /tmp/$name.err
  echo "@@END $name.stderr@@"
  echo "@@BEGIN $name.modules@@"
  cat /proc/modules
  echo "@@END $name.modules@@"
}

echo "@@VM kernel=$(cat /proc/sys/kernel/osrelease)@@"
echo "@@VM machine=$(uname -m)@@"
echo "@@BEGIN start.modules@@"
cat /proc/modules
echo "@@END start.modules@@"
step nvidia install --artifact /artifacts/nvidia.tar.zst
step run run --artifact /artifacts/nvidia.tar.zst
echo "@@BEGIN dmesg@@"
dmesg | grep -E 'NVRM|nvidia' | tail -n 20
echo "@@END dmesg@@"
echo "@@DONE@@"
poweroff -f
