#!/usr/bin/env bash
# Runs a command beside a private Redis Cluster of three masters (no
# replicas, no persistence) on free ports, with WEFT_BENCH_REDIS_CLUSTER
# set to its seed URL, and stops the cluster afterwards:
#
#	bench/cluster.sh go run ./cmd/weft-bench
#
# make bench uses it so that the per-stream measurement runs on a cluster
# too. Needs bash, redis-server and redis-cli (Debian: redis-server,
# redis-tools).
set -euo pipefail

dir=$(mktemp -d /tmp/weft-bench-cluster.XXXXXX)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

# free_port sets port to a random port in 20000-31999 (below Linux's
# ephemeral range, so no outgoing connection takes it meanwhile) that
# nothing listens on and that this script has not handed out yet (no
# subshell: taken must persist).
taken=" "
free_port() {
	while :; do
		port=$((20000 + RANDOM % 12000))
		case "$taken" in *" $port "*) continue ;; esac
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			taken="$taken$port "
			return
		fi
	done
}

addrs=()
for i in 1 2 3; do
	free_port
	node_port=$port
	free_port
	bus=$port
	port=$node_port
	mkdir -p "$dir/$i"
	(cd "$dir/$i" && exec redis-server --port "$port" --cluster-port "$bus" --bind 127.0.0.1 \
		--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
		--save '' --appendonly no --logfile "$dir/$i/redis.log") &
	pids+=($!)
	addrs+=("127.0.0.1:$port")
done
for i in 0 1 2; do
	a=${addrs[$i]}
	up=
	for _ in $(seq 100); do
		redis-cli -h "${a%:*}" -p "${a#*:}" ping >/dev/null 2>&1 && up=1 && break
		sleep 0.05
	done
	if [ -z "$up" ]; then
		echo "bench/cluster.sh: redis-server at $a did not start:" >&2
		tail -5 "$dir/$((i + 1))/redis.log" >&2
		exit 1
	fi
done
redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log"
for _ in $(seq 200); do
	ok=1
	for a in "${addrs[@]}"; do
		redis-cli -h "${a%:*}" -p "${a#*:}" cluster info | grep -q 'cluster_state:ok' || ok=0
	done
	[ "$ok" = 1 ] && break
	sleep 0.05
done

url="redis://${addrs[0]}?addr=${addrs[1]}&addr=${addrs[2]}"
echo "bench/cluster.sh: Redis Cluster at $url" >&2
WEFT_BENCH_REDIS_CLUSTER=$url "$@"
