#!/bin/busybox sh
# /init of scripts/vm-test-secureboot's initramfs, booted by shim and grub
# under OVMF with Secure Boot on: the installer's detect, then installs of
# what its build signed, each result between markers for tests/it/vm.rs
# (vm_secure_boot_results).
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t securityfs securityfs /sys/kernel/security
mkdir -p /run /tmp /var
echo 1 >/proc/sys/kernel/printk
# Debian builds efivarfs as a module (CONFIG_EFIVAR_FS=m); it is signed by
# Debian, so it loads under lockdown too.
insmod /efivarfs.ko && mount -t efivarfs efivarfs /sys/firmware/efi/efivars

# step NAME ARGS...: see /vm-step.sh.
. /vm-step.sh

echo "@@VM kernel=$(cat /proc/sys/kernel/osrelease)@@"
echo "@@VM lockdown=$(cat /sys/kernel/security/lockdown)@@"
echo "@@BEGIN keys@@"
cat /proc/keys
echo "@@END keys@@"
echo "@@BEGIN dmesg@@"
dmesg | grep -Ei 'secure ?boot|lockdown|X\.509|machine'
echo "@@END dmesg@@"
step detect detect
step hello-unsigned install --artifact /artifacts/hello-unsigned.tar.zst
step hello-other install --artifact /artifacts/hello-other.tar.zst
step hello-mok install --artifact /artifacts/hello-mok.tar.zst
step hello-uninstall uninstall --module hello
step nvidia install --artifact /artifacts/nvidia.tar.zst
step run run --artifact /artifacts/nvidia.tar.zst
echo "@@DONE@@"
poweroff -f
