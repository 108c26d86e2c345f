#!/bin/sh
# Installs what the arm64 cross build and the two emulations need (issue 36), on an amd64
# Debian: Debian's cross compiler; the build's -dev packages for arm64 (multiarch: headers
# in /usr/include/aarch64-linux-gnu, libraries in /usr/lib/aarch64-linux-gnu, OpenBLAS's
# under openblas-pthread/ in both); pkgconf:arm64 for aarch64-linux-gnu-pkg-config; and
# qemu-user-static, whose qemu-aarch64-static runs the arm64 binaries and
# qemu-x86_64-static -cpu Nehalem the x86-64 baseline on a CPU without AVX.
# libgomp1:arm64: the cross compiler's own libgomp lies in /usr/aarch64-linux-gnu/lib,
# where qemu finds it only with -L /usr/aarch64-linux-gnu, and that sysroot's libc hung
# under 2 threads; with libc6:arm64 (a dependency of the -dev packages) qemu needs no -L.
# As root: adds the arm64 architecture to dpkg, then installs what is missing with
# data/install_packages.sh; otherwise prints the exact commands and fails. (On Ubuntu the
# arm64 packages come from ports.ubuntu.com, which this does not set up.)
here=$(dirname "$0")
packages="gcc-aarch64-linux-gnu qemu-user-static pkgconf:arm64 libgomp1:arm64
          libopenblas-dev:arm64 libcmocka-dev:arm64 libstb-dev:arm64
          libjpeg62-turbo-dev:arm64 zlib1g-dev:arm64"
if [ "$(dpkg --print-architecture)" = arm64 ]; then
    echo "this is an arm64 machine: the native build needs no cross tools" >&2
    exit 1
fi
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    if [ "$(id -u)" != 0 ]; then
        echo "the arm64 cross build needs the arm64 architecture and these Debian packages:" $packages >&2
        echo "install them with:  sudo dpkg --add-architecture arm64 && sudo apt-get update &&" \
             "sudo apt-get install -y" $packages >&2
        exit 1
    fi
    echo "adding the arm64 architecture to dpkg"
    dpkg --add-architecture arm64 || exit 1
fi
# install_packages.sh runs apt-get update before it installs: the arm64 lists come with it.
exec sh "$here/install_packages.sh" $packages
