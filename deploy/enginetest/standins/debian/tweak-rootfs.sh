#!/bin/sh
# Turns a fresh `debootstrap --variant=minbase` tree into a container base,
# as Debian's official images are: no service starts during apt-get
# install, no documentation or locales unpacked, apt's caches cleaned after
# each install, and the same Debian sources the host's apt uses.
#
#	tweak-rootfs.sh ROOTFS SUITE MIRROR [SECURITY_MIRROR]
set -eu
root=$1 suite=$2 mirror=$3 security=${4:-}

# invoke-rc.d asks this before starting a service: never, in an image.
cat >"$root/usr/sbin/policy-rc.d" <<'EOF'
#!/bin/sh
exit 101
EOF
chmod 755 "$root/usr/sbin/policy-rc.d"

cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF

cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
cat >"$root/etc/apt/apt.conf.d/docker-no-recommends" <<'EOF'
APT::Install-Recommends "false";
EOF

rm -f "$root/etc/apt/sources.list"
{
	printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
		"$mirror" "$suite" "$suite"
	if [ -n "$security" ]; then
		printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
			"$security" "$suite"
	fi
} >"$root/etc/apt/sources.list.d/debian.sources"

rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
# The host's name and resolver are the engine's to provide at run time.
: >"$root/etc/hostname"
rm -f "$root/etc/resolv.conf"
