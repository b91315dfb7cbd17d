#!/bin/sh
# mmdebstrap --customize-hook: $1 is the finished root tree.  A golden
# "host" image for the Ansible tests: every package the cutpoint_host and
# cutpoint_control roles install is already here, so their package tasks are
# no-ops and the guest needs no network beyond the lab link.
set -eu
R=$1
HERE=$(cd "$(dirname "$0")" && pwd)
PROJECT=$(cd "$HERE/../../../.." && pwd)
echo cp-host > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 cp-host\n' > "$R/etc/hosts"
: > "$R/etc/fstab"
# Host keys are made per VM at first boot (cp-net), never shared by copies.
rm -f "$R"/etc/ssh/ssh_host_*
# Python wheels of the runtime dependencies, built here on the build host
# (PyPI through pip), then installed into the image's venv offline.
WH="$R/opt/cutpoint/wheelhouse"
mkdir -p "$WH"
"$PROJECT/.venv/bin/pip" wheel -q -r "$HERE/requirements.txt" -w "$WH"
cp "$HERE/requirements.txt" "$R/opt/cutpoint/requirements.txt"
chroot "$R" python3 -m venv /opt/cutpoint/venv
chroot "$R" /opt/cutpoint/venv/bin/pip install -q --no-index \
    --find-links /opt/cutpoint/wheelhouse -r /opt/cutpoint/requirements.txt
chroot "$R" systemctl enable cp-net.service ssh.service
# The control plane's services are configured by Ansible; the packaged
# defaults may run (PostgreSQL's main cluster, Redis on loopback).  Nothing
# that wakes up on a timer, waits for a network, or asks for a login.
chroot "$R" systemctl mask apt-daily.timer apt-daily-upgrade.timer \
    e2scrub_all.timer e2scrub_reap.service fstrim.timer man-db.timer \
    serial-getty@.service getty@.service getty.target \
    systemd-timesyncd.service remote-fs.target \
    systemd-networkd-wait-online.service 2>/dev/null || true
rm -rf "$R"/usr/share/doc/* "$R"/usr/share/man/* "$R"/usr/share/info/* \
    "$R"/usr/share/locale/* "$R"/var/cache/apt/*.bin "$R"/var/log/*.log
for d in drivers/gpu drivers/media drivers/net/wireless drivers/net/ethernet \
         drivers/infiniband drivers/staging drivers/isdn drivers/bluetooth \
         drivers/usb drivers/hid drivers/iio drivers/scsi drivers/input \
         drivers/mtd drivers/nfc drivers/thunderbolt drivers/video \
         sound net/wireless net/mac80211 net/bluetooth fs/nfsd \
         fs/ocfs2 fs/xfs fs/btrfs fs/gfs2 fs/f2fs; do
    rm -rf "$R"/lib/modules/*/kernel/$d
done
rm -rf "$R"/lib/firmware/*
for k in "$R"/lib/modules/*; do chroot "$R" depmod "$(basename "$k")"; done
