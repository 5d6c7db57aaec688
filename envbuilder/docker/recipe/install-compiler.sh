#!/bin/sh
# Makes the tree of an envbuilder image's compiler layer, in a container of the base image
# (envbuilder/docker/build.py runs it, with the network, once per base image):
#   install-compiler.sh OUT PACKAGE...
# apt installs the Debian PACKAGEs (gcc, g++, libc6-dev; libpython3.X-dev where the base's
# python3 lacks Python.h) from the mirror the base names,
# checked by apt against Debian's signed package lists; the files that the install
# created or changed are copied to OUT with their modes, and OUT/usr/share/envbuilder/
# compiler.txt records the compiler (`cc: <cc --version>`, `cxx: <c++ --version>`, first
# lines) and every package the install added (`package: NAME=VERSION`). apt's lists,
# caches and logs are left out, so the same packages give the same files.
# envbuilder writes OUT as one layer (envbuilder/docker/layers.py).
set -eu
out=$1
shift
command -v apt-get >/dev/null || { echo "install-compiler.sh: the base image has no apt-get (not Debian-based)" >&2; exit 3; }
export DEBIAN_FRONTEND=noninteractive PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin  # dpkg needs the sbin dirs
dpkg-query -W -f '${Package}=${Version}\n' | sort > /tmp/envbuilder-before
stamp=/tmp/envbuilder-stamp
touch "$stamp"
echo "install-compiler.sh: apt-get update"
apt-get update -q -o Acquire::Retries=3 >/tmp/envbuilder-apt.log 2>&1 || { cat /tmp/envbuilder-apt.log; exit 1; }
# Python's headers: inductor's C++ and triton's launcher include Python.h. python:X-slim
# has them in /usr/local/include; a Debian python3 needs libpython3.X-dev (headers only).
include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
if [ ! -f "$include/Python.h" ]; then
  set -- "$@" "libpython$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')-dev"
fi
echo "install-compiler.sh: installing $*"
apt-get install -q -y --no-install-recommends -o Acquire::Retries=3 "$@" >>/tmp/envbuilder-apt.log 2>&1 \
  || { tail -n 40 /tmp/envbuilder-apt.log; exit 1; }
# what changes from run to run and is nobody's input: apt's lists and caches, logs, backups
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log /var/log/alternatives.log \
  /var/cache/ldconfig /var/cache/debconf/*-old /var/lib/dpkg/*-old
mkdir -p "$out/usr/share/envbuilder"
# created or changed since the stamp (dpkg keeps the packages' mtimes, so the change time),
# on the image's own filesystem: not /proc, /sys, the mounts, nor /tmp
find / -xdev -cnewer "$stamp" ! -path / ! -path '/tmp' ! -path '/tmp/*' ! -path '/envbuilder' ! -path '/envbuilder/*' \
  ! -path /etc/hostname ! -path /etc/hosts ! -path /etc/resolv.conf -printf '%P\0' \
  | tar -C / --null --no-recursion --numeric-owner -cf - -T - | tar -C "$out" -xpf -
{
  echo "cc: $(cc --version | head -n1)"
  echo "cxx: $(c++ --version | head -n1)"
  dpkg-query -W -f '${Package}=${Version}\n' | sort | comm -13 /tmp/envbuilder-before - | sed 's/^/package: /'
} > "$out/usr/share/envbuilder/compiler.txt"
echo "install-compiler.sh: $(cc --version | head -n1); $(grep -c '^package:' "$out/usr/share/envbuilder/compiler.txt") Debian package(s)"
