#!/bin/sh
# The README demo, run inside the test VM by `cargo xtask demo`: the standalone CSI driver on real LVM,
# driven by `lvms csi`. Needs LVMS (the binary) and CONFIG (examples/node-engine.yaml) in the environment.
set -eu
SOCK=/run/lvms/csi.sock
csi() { "$LVMS" csi --endpoint "$SOCK" "$@"; }
step() { printf '\n== %s\n' "$*"; }
mnt=/run/lvms-demo
# As kubelet does: the CO makes the staging directories and the targets' parent; the driver the targets.
mkdir -p "$mnt/pods" "$mnt/staging/thin" "$mnt/staging/thick" "$mnt/staging/restored" "$mnt/staging/block"

mkfs.ext4 -q -L not-ours /dev/disk/by-id/virtio-bootlike

step "start the standalone driver (it converges the device classes of $(basename "$CONFIG"))"
"$LVMS" standalone --config "$CONFIG" --endpoint "$SOCK" --node-id demo-node 2>/tmp/standalone.log &
DRIVER=$!
trap 'kill $DRIVER 2>/dev/null || true' EXIT
i=0
until csi probe >/dev/null 2>&1; do
  i=$((i + 1))
  if [ $i -gt 120 ]; then echo "the driver did not become ready:"; cat /tmp/standalone.log; exit 1; fi
  sleep 1
done
csi info
echo "volume groups:"; vgs --noheadings -o vg_name,vg_size,vg_free,vg_tags | sed 's/^/  /'

step "capacity per class"
echo "vg1 (thin, overprovision ratio 10):"; csi capacity --class vg1 | sed 's/^/  /'
echo "thick1 (thick):"; csi capacity --class thick1 | sed 's/^/  /'

step "create a thin xfs volume and a thick ext4 volume"
thin=$(csi --output id create-volume --name demo-thin --size 512Mi --class vg1 --fs xfs)
thick=$(csi --output id create-volume --name demo-thick --size 256Mi --class thick1 --fs ext4)
csi get-volume "$thin"
csi get-volume "$thick"
echo "the same request again answers with the same volume: $(csi --output id create-volume --name demo-thin --size 512Mi --class vg1 --fs xfs)"

step "stage and publish both, write data"
for v in thin thick; do
  id=$(eval echo \$$v); fs=xfs; [ $v = thick ] && fs=ext4
  csi stage "$id" --staging-path "$mnt/staging/$v" --fs $fs >/dev/null
  csi publish "$id" --staging-path "$mnt/staging/$v" --target-path "$mnt/pods/$v" --fs $fs >/dev/null
  echo "hello from the $v volume" > "$mnt/pods/$v/hello.txt"
done
sync
df -h "$mnt/pods/thin" "$mnt/pods/thick" | sed 's/^/  /'

step "snapshot the thin volume, then restore it into a larger volume"
snap=$(csi --output id create-snapshot --name demo-snap --source "$thin")
csi list-snapshots
echo "changed after the snapshot" > "$mnt/pods/thin/hello.txt"
restored=$(csi --output id create-volume --name demo-restored --size 1Gi --class vg1 --fs xfs --from-snapshot "$snap")
csi stage "$restored" --staging-path "$mnt/staging/restored" --fs xfs >/dev/null
csi publish "$restored" --staging-path "$mnt/staging/restored" --target-path "$mnt/pods/restored" --fs xfs >/dev/null
echo "restored volume reads: $(cat "$mnt/pods/restored/hello.txt")"
echo "the original now reads: $(cat "$mnt/pods/thin/hello.txt")"
df -h "$mnt/pods/restored" | sed 's/^/  /'

step "snapshots are refused on a thick class"
csi create-snapshot --name demo-thick-snap --source "$thick" 2>&1 | head -1 || true

step "expand the thin volume online from 512Mi to 768Mi"
before=$(df -h --output=size "$mnt/pods/thin" | tail -1)
csi expand "$thin" --size 768Mi
csi node-expand "$thin" --path "$mnt/pods/thin" --size 768Mi --fs xfs
echo "filesystem size: $before -> $(df -h --output=size "$mnt/pods/thin" | tail -1)"

step "a raw block volume"
blk=$(csi --output id create-volume --name demo-block --size 128Mi --class thick1 --block)
csi stage "$blk" --staging-path "$mnt/staging/block" --block >/dev/null
csi publish "$blk" --staging-path "$mnt/staging/block" --target-path "$mnt/pods/block-dev" --block >/dev/null
echo "$mnt/pods/block-dev is a block device of $(blockdev --getsize64 "$mnt/pods/block-dev") bytes"

step "volume stats"
csi stats "$thin" --path "$mnt/pods/thin"

step "kill -9 the driver and start it again: every volume is still found"
kill -9 $DRIVER; wait $DRIVER 2>/dev/null || true
"$LVMS" standalone --config "$CONFIG" --endpoint "$SOCK" --node-id demo-node 2>>/tmp/standalone.log &
DRIVER=$!
i=0; until csi probe >/dev/null 2>&1; do i=$((i + 1)); [ $i -gt 120 ] && exit 1; sleep 1; done
csi list-volumes

step "clean up"
for v in thin thick restored; do
  id=$(eval echo \$$v)
  csi unpublish "$id" --target-path "$mnt/pods/$v" >/dev/null
  csi unstage "$id" --staging-path "$mnt/staging/$v" >/dev/null
done
csi unpublish "$blk" --target-path "$mnt/pods/block-dev" >/dev/null
csi unstage "$blk" --staging-path "$mnt/staging/block" >/dev/null
csi delete-snapshot "$snap" >/dev/null
for id in "$thin" "$thick" "$restored" "$blk"; do csi delete-volume "$id" >/dev/null; done
echo "volumes left: $(csi --output json list-volumes)"
echo "the decoy disk still carries: $(blkid -o value -s TYPE /dev/disk/by-id/virtio-bootlike)"
echo
echo "demo finished"
