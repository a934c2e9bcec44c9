#!/bin/busybox sh
# /init of the VM tests' initramfs (scripts/vm-test on x86_64,
# scripts/vm-test-arm64 on an emulated arm64 machine): runs the installer
# against the real kernel and prints each result between markers, which
# crates/xtask/src/vmlog.rs parses (for tests/it/vm.rs and cargo xtask e2e).
#
# Which steps run comes from the kernel command line: gpu_driver_vm=nvidia
# (scripts/vm-test-arm64, which has no hello.ko built for its kernel) runs
# only the NVIDIA install and `run`; without it (scripts/vm-test) all run.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run /tmp /var
# Keep kernel messages off the console so they never split a document; the
# installer reads them from /dev/kmsg itself.
echo 1 >/proc/sys/kernel/printk

steps=all
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    gpu_driver_vm=*) steps=${arg#gpu_driver_vm=} ;;
  esac
done

# step NAME ARGS...: see /vm-step.sh.
. /vm-step.sh

# The two ways onto a host (docs/install.md). By hand, through PID 1's
# namespaces; then as from a privileged hostPID pod: another mount
# namespace and root (no /etc, no /sys of its own), the host's files
# reached through /proc/1/root.
host_ways() {
  nsenter -t 1 -m -u -i -n -p -- gpu-driver-installer --log-level info \
    --output /tmp/nsenter.json run 2>/tmp/nsenter.err
  rc=$?
  echo "@@BEGIN nsenter rc=$rc@@"
  cat /tmp/nsenter.json
  echo "@@END nsenter@@"
  mkdir -p /pod/bin /pod/proc /pod/tmp
  cp /bin/gpu-driver-installer /pod/bin/
  mount -t proc proc /pod/proc
  unshare -m chroot /pod /bin/gpu-driver-installer --host-root /proc/1/root \
    --log-level info --output /tmp/pod.json detect 2>/pod/tmp/pod.err
  rc=$?
  echo "@@BEGIN pod rc=$rc@@"
  cat /pod/tmp/pod.json
  echo "@@END pod@@"
}

echo "@@VM kernel=$(cat /proc/sys/kernel/osrelease)@@"
echo "@@VM machine=$(uname -m)@@"
echo "@@BEGIN start.modules@@"
cat /proc/modules
echo "@@END start.modules@@"
if [ "$steps" = all ]; then
  step foreign install --artifact /artifacts/foreign.tar.zst
  step hello-install install --artifact /artifacts/hello.tar.zst
  step hello-again install --artifact /artifacts/hello.tar.zst
  step hello-uninstall uninstall --module hello
fi
step nvidia install --artifact /artifacts/nvidia.tar.zst
step run run --artifact /artifacts/nvidia.tar.zst
[ "$steps" = all ] && host_ways
echo "@@BEGIN dmesg@@"
dmesg | grep -E 'gpu-driver-hello|NVRM|nvidia' | tail -n 20
echo "@@END dmesg@@"
echo "@@DONE@@"
poweroff -f
