# A test node's setup (`cargo xtask installed`, xtask/src/node.rs; it boots two), run in the VM
# after its prelude: the host services a shared class asks of the admin, then containerd and
# kubelet, as a node's init system would start them, with every piece of state on the VM's own
# disk, never on the host's filesystem that the guest shares over 9p.
#
# Environment: NODE_DIR (host directory with kubelet.kubeconfig and ca.crt; logs go to
# NODE_DIR/logs), NODE_DISK (the disk for the node's state: an ext4 filesystem whose containerd/
# holds the images, imported by the host, xtask/src/images.rs), NODE_NAME, NODE_IP (this node's
# own address, on a dummy interface: every node is 10.0.2.15 on its slirp link), NODE_LUN and
# NODE_LUN_MAP (the shared LUN's by-id path and the name of the map over it), POD_SUBNET (this
# node's pod addresses), API_PORT (the API server's port on the host, 10.0.2.2 here), KUBELET (the
# kubelet binary), XTASK, EXEC_PORT and CONNECT_PORT (the guest ports of the command server and
# the API server's proxy).
set -eu
log="$NODE_DIR/logs"
mkdir -p "$log"
hostname "$NODE_NAME"
# iptables' legacy back end, for kubelet, CNI and the rules below: Debian's user-mode kernel has
# nf_tables without its NAT chains, and both kernels have the legacy tables.
modprobe -a overlay bridge br_netfilter veth nf_nat ip_tables iptable_nat iptable_filter \
  xt_MASQUERADE xt_conntrack xt_addrtype xt_nat xt_comment nf_conntrack xt_mark dummy
mkdir -p /run/node-bin
for t in iptables ip6tables; do
  for s in "" -save -restore; do ln -sf "/usr/sbin/$t-legacy$s" "/run/node-bin/$t$s"; done
done
export PATH="/run/node-bin:$PATH"
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
# The node's own address (its InternalIP, kubelet's and the API server's proxy's destination): the
# slirp link's 10.0.2.15 is every node's.
ip link add node0 type dummy
ip addr add "$NODE_IP/32" dev node0
ip link set node0 up
mount -t cgroup2 none /sys/fs/cgroup
# A user-mode kernel's /proc/cpuinfo has no clock speed, which kubelet's cAdvisor requires.
if grep -q '^vendor_id.*User Mode Linux' /proc/cpuinfo && ! grep -q '^cpu MHz' /proc/cpuinfo; then
  { cat /proc/cpuinfo; echo 'cpu MHz		: 1000.000'; } > /run/cpuinfo
  mount --bind /run/cpuinfo /proc/cpuinfo
fi
# Pods with hostIPC (the node plugin: lvm's semaphores) get the host's /dev/shm.
mkdir -p /dev/shm
mountpoint -q /dev/shm || mount -t tmpfs -o mode=1777,nosuid,nodev shm /dev/shm
# Bidirectional mount propagation (the node plugin's mounts reaching kubelet) needs shared mounts.
mount --make-rshared /

# The shared LUN behind a device-mapper map with a multipath uuid (`mpath-…`), as multipath gives
# a SAN LUN: the class names the map (its devices file records it by that uuid; the user-mode
# kernel's disks do not show the map as their holder, so plain lvm commands also see the raw path,
# as a duplicate), and the lost-path test takes the path away (`lun-path lose`: every I/O fails,
# as when the SAN path dies) and gives it back (`lun-path restore`).
if [ -n "${NODE_LUN:-}" ]; then
  raw=$(readlink -f "$NODE_LUN")
  sectors=$(blockdev --getsz "$raw")
  dmsetup create "$NODE_LUN_MAP" --uuid "mpath-$NODE_LUN_MAP" --table "0 $sectors linear $raw 0"
  cat > /run/node-bin/lun-path <<EOF
#!/bin/sh
set -e
case "\$1" in
  lose) table="0 $sectors error" ;;
  restore) table="0 $sectors linear $raw 0" ;;
  *) echo "usage: lun-path lose|restore" >&2; exit 2 ;;
esac
dmsetup suspend --noflush $NODE_LUN_MAP
dmsetup load $NODE_LUN_MAP --table "\$table"
dmsetup resume $NODE_LUN_MAP
EOF
  chmod +x /run/node-bin/lun-path
fi

# The node's disk: /var/lib (kubelet, CNI state) and /var/log over directories on it, the
# container store (with the images) in it.
mkdir -p /run/node
mount "$NODE_DISK" /run/node
mkdir -p /run/node/varlib/kubelet /run/node/varlog /run/node/cni /run/node/containerd \
  /run/node/etc-lvm/backup /run/node/etc-lvm/archive
mount --bind /run/node/varlib /var/lib
mount --bind /run/node/varlog /var/log
mount --bind /var/lib/kubelet /var/lib/kubelet
mount --make-rshared /var/lib/kubelet
# The node plugin mounts the host's /etc/lvm: give it the guest's own, not the host's over 9p.
# No udev device list and no event activation, as for the VM suite (xtask/src/vm.rs).
cat > /run/node/etc-lvm/lvm.conf <<'EOF'
devices {
    obtain_device_list_from_udev = 0
}
global {
    event_activation = 0
}
EOF
mount --bind /run/node/etc-lvm /etc/lvm

# The host services a shared class needs, as docs/shared-classes.md's "Host preparation" asks of
# the admin (as crates/lvms/tests/shared_vms.rs starts them): softdog petted by wdmd, sanlock with
# the watchdog, lvmlockd on sanlock. They read the /etc/lvm the node plugin mounts (the prelude's
# LVM_SYSTEM_DIR is the VM suite's); the node agent installs its own fence hook.
mkdir -p /run/sanlock /run/lvm /run/wdmd /run/lvms
modprobe softdog
# softdog's device: by its identity; without one (the user-mode kernel has no watchdog sysfs
# attributes), the one watchdog of the class there (its harddog is /dev/watchdog, not a class
# device).
soft=
for d in /sys/class/watchdog/*; do
  if [ -r "$d/identity" ]; then
    [ "$(cat "$d/identity")" != 'Software Watchdog' ] || soft="/dev/${d##*/}"
  elif [ -e "$d" ] && [ -z "$soft" ]; then
    soft="/dev/${d##*/}"
  fi
done
[ -n "$soft" ] || { echo "node: no softdog watchdog"; exit 1; }
setsid wdmd -D -w "$soft" >"$log/wdmd.log" 2>&1 </dev/null &
i=0
until [ -S /run/wdmd/wdmd.sock ]; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || { echo "node: wdmd did not start"; cat "$log/wdmd.log"; exit 1; }
  sleep 0.2
done
LVM_SYSTEM_DIR=/etc/lvm sanlock daemon -U root -G root
i=0
until sanlock client status >/dev/null 2>&1; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || { echo "node: sanlock did not start"; exit 1; }
  sleep 0.2
done
LVM_SYSTEM_DIR=/etc/lvm lvmlockd -g sanlock -o 5
i=0
until LVM_SYSTEM_DIR=/etc/lvm lvmlockctl --info >/dev/null 2>&1; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || { echo "node: lvmlockd did not start"; exit 1; }
  sleep 0.2
done
echo "node: wdmd, sanlock and lvmlockd started"
# No DNS here: pods get an empty resolv.conf.
: > /run/node/resolv.conf

# The pod network: one bridge, host-local addresses of this node's subnet, masquerading out of
# the node.
cat > /run/node/cni/10-bridge.conflist <<EOF
{
  "cniVersion": "1.0.0",
  "name": "lvms-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
# kube-proxy's one job here: the `kubernetes` Service (10.0.0.1:443) is the API server on the host.
for chain in OUTPUT PREROUTING; do
  iptables -t nat -A "$chain" -d 10.0.0.1/32 -p tcp --dport 443 \
    -j DNAT --to-destination "10.0.2.2:$API_PORT"
done

cat > /run/node/containerd.toml <<'EOF'
version = 2
root = "/run/node/containerd"
state = "/run/containerd"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.2"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/run/node/cni"
EOF
setsid containerd --config /run/node/containerd.toml >"$log/containerd.log" 2>&1 </dev/null &
i=0
until ctr version >/dev/null 2>&1; do
  i=$((i + 1))
  [ "$i" -lt 120 ] || { echo "node: containerd did not start"; exit 1; }
  sleep 1
done
ctr -n k8s.io images ls -q >"$log/images.log"

cat > /run/node/kubelet.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# containerd 1.6 reports no cgroup driver over CRI; kubelet 1.36 falls back to this (ADR 0018).
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
resolvConf: /run/node/resolv.conf
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $NODE_DIR/ca.crt}
authorization: {mode: Webhook}
# A small disk and a small VM: evict only when nearly full, never collect the imported images.
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
setsid "$KUBELET" --config /run/node/kubelet.yaml --kubeconfig "$NODE_DIR/kubelet.kubeconfig" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" >"$log/kubelet.log" 2>&1 </dev/null &
# The API server reaches pods (the webhook's endpoint) and kubelet through this, as through
# konnectivity: an HTTP CONNECT proxy behind a forwarded port.
setsid "$XTASK" guest-connect "$CONNECT_PORT" >"$log/connect.log" 2>&1 </dev/null &
echo "node: containerd and kubelet started"
exec "$XTASK" guest-serve "$EXEC_PORT"
