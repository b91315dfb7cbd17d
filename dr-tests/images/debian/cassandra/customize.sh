#!/bin/sh
# mmdebstrap --customize-hook: $1 is the finished root tree, $2 the host
# folder with cassandra-all 5.0.4 and its runtime jars (fetched by Maven on
# the host, cutpoint.lab.debian_image.maven_jars).  Configures the guest at
# image build time and trims what a drill VM never needs.
set -eu
R=$1
JARS=$2
echo cp-cass > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 cp-cass\n' > "$R/etc/hosts"
: > "$R/etc/fstab"
mkdir -p "$R/opt/cassandra/lib"
cp "$JARS"/*.jar "$R/opt/cassandra/lib/"
# Native libraries for other platforms inside jars stay (unpacking them is
# not worth it); sigar/jna pick the linux-x86-64 ones.
chroot "$R" useradd --system --home-dir /srv --no-create-home --shell /usr/sbin/nologin cassandra
chroot "$R" systemctl enable cp-disks.service cp-net.service cp-cassandra.service cp-workload.service
chroot "$R" systemctl mask apt-daily.timer apt-daily-upgrade.timer \
    e2scrub_all.timer e2scrub_reap.service fstrim.timer \
    serial-getty@.service getty@.service getty.target \
    systemd-timesyncd.service remote-fs.target \
    systemd-networkd-wait-online.service 2>/dev/null || true
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
for k in "$R"/lib/modules/*; do chroot "$R" depmod "$(basename "$k")"; done
