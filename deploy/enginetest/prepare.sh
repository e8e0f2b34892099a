#!/usr/bin/env bash
# Makes this Debian machine able to run deploy/'s compose files, then
# prints the image variables the compose files read (KEY=VALUE lines on
# stdout; progress goes to stderr). enginetest's TestMain runs it.
#
# What it installs or starts only when absent: Debian's docker.io (and
# dockerd, started in the background), the Docker Compose v2 plugin built
# from its Go module at a pinned version into ~/.docker/cli-plugins, and
# debootstrap. What it builds, because no image registry is reachable
# here: stand-ins for the compose files' base images, from Debian's
# packages on a Debian root filesystem made with debootstrap (standins/).
# Each image carries a label with a hash of its inputs (its directory,
# its base image, the versions it was made from) and is rebuilt only when
# that changes: the first run on a fresh machine builds them all, later
# runs reuse them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export PATH="/usr/local/go/bin:$PATH"

COMPOSE_MODULE=github.com/docker/compose/v5
COMPOSE_VERSION=v5.6.0
LABEL=org.weft.compose-test.inputs

log() { printf 'prepare: %s\n' "$*" >&2; }
die() {
	log "FAILED: $*"
	exit 1
}

apt_updated=
apt_install() {
	[ "$(id -u)" = 0 ] || die "apt-get install $*: needs root"
	if [ -z "$apt_updated" ]; then
		apt-get update -qq >&2
		apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# --- the engine
if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
	log "installing docker.io"
	apt_install docker.io
fi
if ! docker info >/dev/null 2>&1; then
	[ "$(id -u)" = 0 ] || die "the Docker engine is not answering and starting it needs root"
	dockerd_log=/var/log/weft-compose-test-dockerd.log
	log "starting dockerd (log: $dockerd_log)"
	# No init system runs services here: dockerd outlives this script, as
	# an engine does.
	setsid dockerd >>"$dockerd_log" 2>&1 </dev/null &
	for _ in $(seq 1 120); do
		docker info >/dev/null 2>&1 && break
		sleep 0.5
	done
	docker info >/dev/null 2>&1 || {
		tail -20 "$dockerd_log" >&2
		die "dockerd did not answer within 60 s"
	}
fi
log "engine: $(docker version -f 'dockerd {{.Server.Version}}, API {{.Server.APIVersion}}, client {{.Client.Version}}')"

# --- the compose plugin, built from its Go module (not packaged in Debian)
plugin_dir=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
have=$(docker compose version --short 2>/dev/null || true)
if [ "v${have#v}" != "$COMPOSE_VERSION" ]; then
	tmp=$(mktemp -d)
	log "building docker compose $COMPOSE_VERSION from $COMPOSE_MODULE (about 2 minutes on an idle machine; found: ${have:-none})"
	# Outside any module: the download is of compose alone.
	src=$(cd "$tmp" && go mod download -json "$COMPOSE_MODULE@$COMPOSE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -d "$src" ] || die "go mod download $COMPOSE_MODULE@$COMPOSE_VERSION gave no source directory"
	# Built as the main module: `go install` refuses a module whose go.mod
	# has exclude directives. The module cache is read-only; build a copy.
	cp -r "$src" "$tmp/src"
	chmod -R u+w "$tmp/src"
	(cd "$tmp/src" && go build -trimpath -ldflags "-w -X $COMPOSE_MODULE/internal.Version=$COMPOSE_VERSION" -o "$tmp/docker-compose" ./cmd) >&2
	mkdir -p "$plugin_dir"
	if [ -e "$plugin_dir/docker-compose" ]; then
		log "keeping the plugin that was there as $plugin_dir/docker-compose.${have:-unknown}"
		mv "$plugin_dir/docker-compose" "$plugin_dir/docker-compose.${have:-unknown}"
	fi
	install -m 755 "$tmp/docker-compose" "$plugin_dir/docker-compose"
	rm -rf "$tmp"
	have=$(docker compose version --short 2>/dev/null || true)
	[ "v${have#v}" = "$COMPOSE_VERSION" ] || die "docker compose version says ${have:-nothing}, want $COMPOSE_VERSION"
fi
log "compose: $(docker compose version)"

# --- the stand-in images
# inputs FILE... -- EXTRA...: a short hash of the files' contents and the
# extra words, the label that says an image is up to date.
inputs() {
	{
		while [ $# -gt 0 ] && [ "$1" != -- ]; do
			printf '%s\n' "$1"
			cat "$1"
			shift
		done
		printf '%s\n' "$@"
	} | sha256sum | cut -c1-16
}
label_of() { docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null || true; }

# build TAG DIR CONTEXT EXTRA...: builds DIR/Dockerfile on CONTEXT FROM the
# Debian base unless TAG is up to date.
build() {
	local tag=$1 dir=$2 context=$3
	shift 3
	local key
	key=$(cd "$dir" && inputs $(find . -type f | sort) -- "$(docker image inspect -f '{{.Id}}' "$debian")" "$@")
	if [ "$(label_of "$tag")" = "$key" ]; then
		log "$tag: up to date"
		return
	fi
	log "building $tag"
	local start=$SECONDS out
	out=$(mktemp)
	# The host's network: the build installs Debian packages.
	docker build --network host --build-arg "BASE=$debian" --label "$LABEL=$key" \
		-f "$dir/Dockerfile" -t "$tag" "$context" >"$out" 2>&1 || {
		tail -30 "$out" >&2
		die "docker build $tag failed (its last lines above; all of it in $out)"
	}
	rm -f "$out"
	log "$tag: built in $((SECONDS - start)) s"
}

# The Debian release and mirrors the host's apt uses.
. /etc/os-release
suite=${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}
repos() { apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' 2>/dev/null | sort -u; }
[ -n "$(repos)" ] || { apt-get update -qq >&2 && apt_updated=1; }
mirror=$(repos | awk -v s="$suite" '$2 == s { print $1; exit }')
security=$(repos | awk -v s="$suite-security" '$2 == s { print $1; exit }')
[ -n "$mirror" ] || die "apt has no source for $suite: no Debian mirror to debootstrap from"

debian=local/weft-test-debian:$suite
key=$(cd "$here/standins/debian" && inputs tweak-rootfs.sh -- minbase "$suite" "$mirror" "$security")
if [ "$(label_of "$debian")" = "$key" ]; then
	log "$debian: up to date"
else
	command -v debootstrap >/dev/null || {
		log "installing debootstrap"
		apt_install debootstrap
	}
	[ "$(id -u)" = 0 ] || die "debootstrap needs root"
	rootfs=$(mktemp -d /var/tmp/weft-rootfs.XXXXXX)
	log "debootstrap --variant=minbase $suite from $mirror (a few minutes)"
	start=$SECONDS
	debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
		tail -20 "$rootfs.log" >&2
		die "debootstrap failed (log: $rootfs.log)"
	}
	sh "$here/standins/debian/tweak-rootfs.sh" "$rootfs" "$suite" "$mirror" "$security"
	tar -C "$rootfs" -c . | docker import --change "LABEL $LABEL=$key" --change 'CMD ["bash"]' - "$debian" >/dev/null
	rm -rf "$rootfs" "$rootfs.log"
	log "$debian: built in $((SECONDS - start)) s"
fi

# The build stage's Go: the Dockerfile's golang:X.Y tag, at this machine's
# patch release when it is that X.Y (what the deploy tests build with).
go_minor=$(sed -n 's/^ARG WEFT_GO_IMAGE=golang:\([0-9]*\.[0-9]*\).*/\1/p' "$repo/deploy/Dockerfile")
[ -n "$go_minor" ] || die "deploy/Dockerfile: no ARG WEFT_GO_IMAGE=golang:X.Y..."
go_version=$(go env GOVERSION)
case "$go_version" in
"go$go_minor" | "go$go_minor".*) ;;
*) go_version=go$go_minor.0 ;;
esac
toolchain=golang.org/toolchain@v0.0.1-$go_version.linux-$(go env GOARCH)
go_src=$(cd /tmp && go mod download -json "$toolchain" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$go_src" ] || die "go mod download $toolchain gave no directory"

golang=local/weft-test-golang:${go_version#go}
runtime=local/weft-test-busybox:$suite
redis=local/weft-test-redis:$suite
postgres=local/weft-test-postgres:$suite
prometheus=local/weft-test-prometheus:$suite
# The golang stand-in's context: the toolchain (linked, not copied, where
# the filesystem allows) and this machine's CA bundle.
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] || die "no CA bundle at $ca (Debian's ca-certificates package) for HTTPS in the Go build stage"
go_ctx=$(mktemp -d)
cp -al "$go_src" "$go_ctx/go" 2>/dev/null || cp -r "$go_src" "$go_ctx/go"
cp "$ca" "$go_ctx/ca-certificates.crt"
build "$golang" "$here/standins/golang" "$go_ctx" "$toolchain" "$(sha256sum <"$ca")"
rm -rf "$go_ctx"
build "$runtime" "$here/standins/runtime" "$here/standins/runtime"
build "$redis" "$here/standins/redis" "$here/standins/redis"
build "$postgres" "$here/standins/postgres" "$here/standins/postgres"
build "$prometheus" "$here/standins/prometheus" "$here/standins/prometheus"

# What the compose files and the Dockerfile read; Grafana has no stand-in
# (deploy/README.md says why).
cat <<EOF
WEFT_GO_IMAGE=$golang
WEFT_RUNTIME_IMAGE=$runtime
WEFT_REDIS_IMAGE=$redis
WEFT_POSTGRES_IMAGE=$postgres
WEFT_PROMETHEUS_IMAGE=$prometheus
GOPROXY=$(go env GOPROXY)
EOF
