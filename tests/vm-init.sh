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

# The two ways onto a host (docs/install.md). By hand, through PID 1's
# namespaces:
nsenter -t 1 -m -u -i -n -p -- gpu-driver-installer --log-level info \
  --output /tmp/nsenter.json run 2>/tmp/nsenter.err
rc=$?
echo "@@BEGIN nsenter rc=$rc@@"
cat /tmp/nsenter.json
echo "@@END nsenter@@"
# As from a privileged hostPID pod: another mount namespace and root (no
# /etc, no /sys of its own), the host's files reached through /proc/1/root.
mkdir -p /pod/bin /pod/proc /pod/tmp
cp /bin/gpu-driver-installer /pod/bin/
mount -t proc proc /pod/proc
unshare -m chroot /pod /bin/gpu-driver-installer --host-root /proc/1/root \
  --log-level info --output /tmp/pod.json detect 2>/pod/tmp/pod.err
rc=$?
echo "@@BEGIN pod rc=$rc@@"
cat /pod/tmp/pod.json
echo "@@END pod@@"
echo "@@BEGIN dmesg@@"
dmesg | grep -E 'gpu-driver-hello|NVRM|nvidia' | tail -n 20
echo "@@END dmesg@@"
echo "@@DONE@@"
poweroff -f
