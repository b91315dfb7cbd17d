#!/bin/sh
# mmdebstrap --customize-hook: $1 is the finished root tree.  Configures the
# guest at image build time and trims what a drill VM never needs.
set -eu
R=$1
echo cp-pg > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 cp-pg\n' > "$R/etc/hosts"
# No fstab entries: the kernel mounts root rw (root=/dev/vda rw); the group
# disks are mounted by cp-disks.service.
: > "$R/etc/fstab"
# The package's own cluster (/var/lib/postgresql/15/main) is not used: the
# drill cluster lives on the data and WAL disks.
rm -rf "$R/var/lib/postgresql/15/main" "$R/etc/postgresql/15/main"
chroot "$R" systemctl enable cp-disks.service cp-postgres.service cp-workload.service
# Nothing that wakes up on a timer, waits for a network, or asks for a login.
chroot "$R" systemctl mask apt-daily.timer apt-daily-upgrade.timer \
    e2scrub_all.timer e2scrub_reap.service fstrim.timer \
    serial-getty@.service getty@.service getty.target postgresql.service \
    systemd-timesyncd.service remote-fs.target \
    systemd-networkd-wait-online.service 2>/dev/null || true
# Trim: documentation, locales, apt lists and caches, and kernel modules a
# virtio guest never loads (the initrd was built before this, with all of them).
rm -rf "$R"/usr/share/doc/* "$R"/usr/share/man/* "$R"/usr/share/info/* \
    "$R"/usr/share/locale/* "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/* \
    "$R"/usr/share/lintian "$R"/usr/share/bash-completion "$R"/var/log/*.log
for d in drivers/gpu drivers/media drivers/net/wireless drivers/net/ethernet \
         drivers/infiniband drivers/staging drivers/isdn drivers/bluetooth \
         drivers/usb drivers/hid drivers/iio drivers/scsi drivers/input \
         drivers/md drivers/mtd drivers/nfc drivers/platform drivers/thunderbolt \
         drivers/target drivers/video drivers/watchdog drivers/hwmon \
         drivers/misc drivers/mmc drivers/power drivers/leds drivers/edac \
         sound net/wireless net/mac80211 net/bluetooth fs/nfs fs/nfsd \
         fs/ocfs2 fs/xfs fs/btrfs fs/ceph fs/smb fs/cifs fs/gfs2 fs/f2fs; do
    rm -rf "$R"/lib/modules/*/kernel/$d
done
rm -rf "$R"/lib/firmware/*
# PostgreSQL's JIT pulls in LLVM and z3 (about 135 MB); the drill cluster
# runs with jit = off (cp-pg-init), so the libraries are never loaded.
rm -rf "$R"/usr/lib/x86_64-linux-gnu/libLLVM-*.so* "$R"/usr/lib/x86_64-linux-gnu/libz3.so* \
    "$R"/usr/lib/postgresql/*/lib/llvmjit* "$R"/usr/lib/postgresql/*/lib/bitcode
for k in "$R"/lib/modules/*; do chroot "$R" depmod "$(basename "$k")"; done
