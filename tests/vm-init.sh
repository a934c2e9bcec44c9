#!/bin/busybox sh
# /init of scripts/vm-test's initramfs: runs the installer against the real
# kernel and prints each result between markers for tests/vm.rs.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run /tmp /var
# Keep kernel messages off the console so they never split a document; the
# installer reads them from /dev/kmsg itself.
echo 1 >/proc/sys/kernel/printk

# step NAME ARGS...: runs the installer, prints exit code, result, stderr
# and /proc/modules afterwards.
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
echo "@@BEGIN start.modules@@"
cat /proc/modules
echo "@@END start.modules@@"
step foreign install --artifact /artifacts/foreign.tar.zst
step hello-install install --artifact /artifacts/hello.tar.zst
step hello-again install --artifact /artifacts/hello.tar.zst
step hello-uninstall uninstall --module hello
step nvidia install --artifact /artifacts/nvidia.tar.zst
step run run --artifact /artifacts/nvidia.tar.zst
echo "@@BEGIN dmesg@@"
dmesg | grep -E 'gpu-driver-hello|NVRM|nvidia' | tail -n 20
echo "@@END dmesg@@"
echo "@@DONE@@"
poweroff -f
