#!/usr/bin/env bash
# A one-node Ceph cluster with its S3 gateway, for ldfs's store tests (issue 20).
#
#   scripts/ceph.sh start  DIR   install the packages if missing, make the cluster in DIR if it is
#                                not there, start what is not running, wait until S3 answers,
#                                write DIR/env (source it: AWS_ENDPOINT_URL, keys, region)
#   scripts/ceph.sh stop   DIR   stop radosgw, the OSD, the manager, the monitor (in that order)
#   scripts/ceph.sh status DIR   which daemons run; exit 0 only if all four do and S3 answers
#   scripts/ceph.sh env    DIR   print DIR/env
#   scripts/ceph.sh destroy DIR  stop, then remove DIR
#
# Everything (conf, keys, the monitor's store, the OSD's block file, logs, pid files) lives in
# DIR; every daemon binds 127.0.0.1 on ports chosen free at creation and kept in DIR/ports. Run
# twice, start and stop do nothing more. Exit 3 = the Ceph packages are missing and cannot be
# installed (tests that need the gateway skip loudly on it); any other failure is an error.
#
# Pitfalls met (issue 20, "Real parts"): bluestore_block_path stays unset (with
# bluestore_block_create the OSD makes its own file; pointing the path at it loops);
# osd_memory_target below 896 MiB is ignored; mgr_initial_modules must be in the conf before the
# monitor's mkfs; auth_allow_insecure_global_id_reclaim = false for HEALTH_OK; RGW's pools are
# made at the first request, so the first bucket creation takes a few seconds.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop|status|env|destroy DIR" >&2
  exit 2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/ceph.conf
log() { echo "ceph.sh: $*" >&2; }

pid_alive() { # name
  local f=$dir/run/$1.pid
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

# ss (iproute2) where there is one; else whether something accepts a connection there.
port_in_use() {
  if command -v ss >/dev/null 2>&1; then
    ss -ltnH "sport = :$1" 2>/dev/null | grep -q .
  else
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
  fi
}

free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 20000))
    if ! port_in_use "$p"; then
      echo "$p"
      return
    fi
  done
  log "no free port found"
  exit 1
}

install_packages() {
  local bins=(ceph-mon ceph-mgr ceph-osd radosgw ceph ceph-authtool monmaptool radosgw-admin)
  local missing=0 b
  for b in "${bins[@]}"; do command -v "$b" >/dev/null 2>&1 || missing=1; done
  [ "$missing" = 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "the Ceph packages are missing and cannot be installed here (not root, or no apt-get)"
    exit 3
  fi
  log "installing ceph-mon ceph-mgr ceph-osd radosgw ceph-common"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends ceph-mon ceph-mgr ceph-osd radosgw ceph-common; } >"$dir/apt.log" 2>&1; then
    tail -5 "$dir/apt.log" >&2
    log "the Ceph packages could not be installed (see $dir/apt.log)"
    exit 3
  fi
}

s3_answers() {
  local port
  port=$(sed -n 's/^rgw=//p' "$dir/ports")
  # curl where there is one (an HTTP answer); else a TCP connect to beast's port.
  if command -v curl >/dev/null 2>&1; then
    curl -s -o /dev/null -m 2 "http://127.0.0.1:$port/"
  else
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null
  fi
}

wait_for() { # what seconds command...
  # A wall-clock deadline; each command bounds its own try (`ceph_`:
  # --connect-timeout and timeout), so one that blocks (the ceph client
  # against a monitor that is not there) cannot stretch the wait for ever.
  local what=$1 secs=$2
  shift 2
  local deadline=$((SECONDS + secs))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  log "timed out after ${secs}s waiting for $what (see $dir/log/)"
  return 1
}

ceph_() { timeout 30 ceph --connect-timeout 5 -c "$conf" "$@"; }

create() {
  local fsid mon_port rgw_port
  fsid=$(cat /proc/sys/kernel/random/uuid)
  mon_port=$(free_port)
  rgw_port=$(free_port)
  while [ "$rgw_port" = "$mon_port" ]; do rgw_port=$(free_port); done
  mkdir -p "$dir"/{run,log,mon/ceph-a,mgr/ceph-a,osd,rgw}
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$mon_port]
mon_initial_members = a
public_network = 127.0.0.1/32
ms_bind_ipv6 = false
ms_bind_msgr1 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
run_dir = $dir/run
pid_file = $dir/run/\$name.pid
admin_socket = $dir/run/\$name.asok
log_file = $dir/log/\$name.log
mon_data = $dir/mon/\$cluster-\$id
mgr_data = $dir/mgr/\$cluster-\$id
osd_data = $dir/osd/\$cluster-\$id
mgr_initial_modules = iostat
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_max_pg_per_osd = 1000
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
mon_data_avail_warn = 2
mon_data_avail_crit = 1

[client.admin]
keyring = $dir/keyring

[mon]
keyring = \$mon_data/keyring

[mgr]
keyring = \$mgr_data/keyring

[osd]
keyring = \$osd_data/keyring
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = 21474836480
osd_memory_target = 939524096
bluestore_fsck_on_mkfs = false

[client.rgw.a]
keyring = $dir/rgw/keyring
rgw_frontends = beast endpoint=127.0.0.1:$rgw_port
rgw_data = $dir/rgw
EOF
  printf 'mon=%s\nrgw=%s\n' "$mon_port" "$rgw_port" >"$dir/ports"

  ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/keyring" >/dev/null
  monmaptool --create --addv a "[v2:127.0.0.1:$mon_port]" --fsid "$fsid" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring"
  touch "$dir/mon/ceph-a/created"
}

start() {
  install_packages
  local t0=$SECONDS
  [ -f "$dir/mon/ceph-a/created" ] || create
  pid_alive mon.a || ceph-mon -c "$conf" -i a 9>&- 2>>"$dir/log/daemons.err"
  wait_for "the monitor" 60 ceph_ mon stat

  if [ ! -f "$dir/mgr/ceph-a/keyring" ]; then
    ceph_ auth get-or-create mgr.a mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
      -o "$dir/mgr/ceph-a/keyring"
  fi
  pid_alive mgr.a || ceph-mgr -c "$conf" -i a 9>&- 2>>"$dir/log/daemons.err"

  if [ ! -f "$dir/osd/ceph-0/created" ]; then
    local uuid secret id
    uuid=$(cat /proc/sys/kernel/random/uuid)
    secret=$(ceph-authtool --gen-print-key)
    id=$(echo "{\"cephx_secret\": \"$secret\"}" | ceph_ osd new "$uuid" -i -)
    [ "$id" = 0 ] || { log "expected OSD id 0, got $id"; exit 1; }
    mkdir -p "$dir/osd/ceph-0"
    ceph-authtool --create-keyring "$dir/osd/ceph-0/keyring" --name osd.0 --add-key "$secret" >/dev/null
    ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$uuid" >"$dir/log/osd-mkfs.out" 2>&1 \
      || { cat "$dir/log/osd-mkfs.out" >&2; exit 1; }
    touch "$dir/osd/ceph-0/created"
  fi
  pid_alive osd.0 || ceph-osd -c "$conf" -i 0 9>&- 2>>"$dir/log/daemons.err"

  if [ ! -f "$dir/rgw/keyring" ]; then
    ceph_ auth get-or-create client.rgw.a mon 'allow rw' osd 'allow rwx' -o "$dir/rgw/keyring"
  fi
  wait_for "the OSD to come up" 120 timeout 15 sh -c "ceph --connect-timeout 5 -c '$conf' osd stat | grep -q '1 up'"
  pid_alive client.rgw.a || radosgw -c "$conf" -n client.rgw.a 9>&- 2>>"$dir/log/daemons.err"
  wait_for "the S3 gateway" 120 s3_answers

  if [ ! -f "$dir/env" ]; then
    local key secret
    key=$(head -c 15 /dev/urandom | base32 | tr -d '=')
    secret=$(head -c 30 /dev/urandom | base64 | tr -d '=+/')
    timeout 120 radosgw-admin -c "$conf" user create --uid=ldfs --display-name=ldfs \
      --access-key="$key" --secret-key="$secret" >/dev/null
    local port
    port=$(sed -n 's/^rgw=//p' "$dir/ports")
    cat >"$dir/env.tmp" <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=us-east-1
export AWS_DEFAULT_REGION=us-east-1
EOF
    chmod 600 "$dir/env.tmp"
    mv "$dir/env.tmp" "$dir/env"
  fi
  log "S3 gateway answering at $(sed -n 's/^export AWS_ENDPOINT_URL=//p' "$dir/env") after $((SECONDS - t0)) s; env in $dir/env"
}

stop_one() { # name
  local f=$dir/run/$1.pid pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for i in $(seq 1 300); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$1 ($pid) still running after 30 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$f"
}

stop() {
  stop_one client.rgw.a
  stop_one osd.0
  stop_one mgr.a
  stop_one mon.a
}

status() {
  local rc=0 n
  for n in mon.a mgr.a osd.0 client.rgw.a; do
    if pid_alive "$n"; then echo "$n: running ($(cat "$dir/run/$n.pid"))"; else echo "$n: stopped"; rc=1; fi
  done
  if [ -f "$dir/ports" ] && s3_answers; then echo "s3: answering"; else echo "s3: not answering"; rc=1; fi
  if pid_alive mon.a; then ceph_ health 2>/dev/null || true; fi
  return $rc
}

case $cmd in
  start)
    # One start at a time per DIR (tests in parallel may all ask for the same cluster).
    exec 9>"$dir/.lock"
    flock 9
    start
    ;;
  stop)
    exec 9>"$dir/.lock"
    flock 9
    stop
    ;;
  status) status ;;
  env) cat "$dir/env" ;;
  destroy)
    exec 9>"$dir/.lock"
    flock 9
    stop
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start|stop|status|env|destroy DIR" >&2
    exit 2
    ;;
esac
