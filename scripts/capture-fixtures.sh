#!/bin/sh
# Captures real lvm / lsblk / blkid output inside the test VM into crates/host/tests/fixtures/real/.
# Run: cargo xtask vm-run --disk fx0=1024 --disk fx1=1024 --disk fx2=1024 --disk fxext4=256 --disk fxpart=256 -- sh scripts/capture-fixtures.sh
set -e
out=crates/host/tests/fixtures/real
mkdir -p "$out"
d0=/dev/disk/by-id/virtio-fx0 d1=/dev/disk/by-id/virtio-fx1 d2=/dev/disk/by-id/virtio-fx2
mkfs.ext4 -q /dev/disk/by-id/virtio-fxext4
printf 'label: gpt\n,64M,,\n,,\n' | sfdisk -q /dev/disk/by-id/virtio-fxpart
sfdisk --part-label /dev/disk/by-id/virtio-fxpart 1 'BIOS boot' >/dev/null 2>&1 || true
udevadm settle
pvcreate -q --metadatasize 4m "$d0" "$d1" "$d2"
vgcreate -q --addtag lvms vg1 "$d0" "$d1"
vgcreate -q foreign "$d2"
lvcreate -q -y -L 512m --chunksize 128k --poolmetadatasize 16m -T vg1/pool1
lvcreate -q -y -V 256m -T vg1/pool1 -n thin1 --addtag lvms-volume
dd if=/dev/zero of=/dev/vg1/thin1 bs=1M count=8 status=none
lvcreate -q -y -s -n snap1 vg1/thin1 --addtag lvms-snapshot
lvcreate -q -y -L 64m -n linear1 vg1
lvcreate -q -y -L 64m -i 2 -I 64k -n striped1 vg1
lvcreate -q -y -L 64m --type raid1 -m 1 -n raid1 vg1
lvcreate -q -y -L 64m -n other foreign
R="--reportformat json --units b --nosuffix"
lvm pvs $R -o pv_all > "$out/pvs-all.json"
lvm vgs $R -o vg_all > "$out/vgs-all.json"
lvm lvs $R -o lv_all > "$out/lvs-all.json"
lvm lvs -a $R -o lv_all > "$out/lvs-all-hidden.json"
lvs $R -o lv_name,vg_name,lv_uuid,lv_size,lv_attr,segtype,pool_lv,origin,data_percent,metadata_percent,lv_metadata_size,sync_percent,lv_tags,lv_path,lv_dm_path,stripes,stripe_size > "$out/lvs-fields.json"
lsblk -J -b -O > "$out/lsblk-all.json"
lsblk -J -b -o NAME,KNAME,PATH,TYPE,SIZE,RO,STATE,PARTLABEL,FSTYPE,ROTA,SERIAL,MODEL,MOUNTPOINTS,PKNAME > "$out/lsblk-fields.json"
blkid -p -o export /dev/disk/by-id/virtio-fxext4 > "$out/blkid-ext4.txt"
blkid -p -o export /dev/disk/by-id/virtio-fxpart > "$out/blkid-gpt.txt"
cat /proc/self/mountinfo > "$out/mountinfo.txt"
# Error texts callers branch on.
{
  lvcreate -y -L 100g -n toobig vg1 2>&1 || true
  lvremove -y vg1/missing 2>&1 || true
  vgs nosuchvg 2>&1 || true
  lvcreate -y -L 64m -n linear1 vg1 2>&1 || true
  vgcreate vg1 "$d2" 2>&1 || true
  lvcreate -y -V 1g -T vg1/nopool -n x 2>&1 || true
} > "$out/errors.txt"
lvm version > "$out/lvm-version.txt"
vgremove -ff -y vg1 foreign >/dev/null
echo captured: ; ls "$out"
