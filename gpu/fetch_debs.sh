#!/bin/sh
# Downloads the Debian packages that the build and gpu/run.sh need into DIR (make gpu-debs:
# gpu/debs, which git ignores), for a machine that has neither them nor a network: the
# GPU machine, which has nvcc, cuBLAS and a C compiler, and unpacks these with dpkg -x.
# The libraries' own dependencies that such an image may lack come too (libgfortran5 and
# libquadmath0 for OpenBLAS, zlib1g); dataset-fashion-mnist is the data of the training runs.
#   sh gpu/fetch_debs.sh gpu/debs
set -eu
DIR=${1:?usage: sh gpu/fetch_debs.sh DIR}
PACKAGES="libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
libstb-dev libstb0 libjpeg62-turbo-dev libjpeg62-turbo zlib1g-dev zlib1g
libcmocka-dev libcmocka0 dataset-fashion-mnist"
mkdir -p "$DIR"
cd "$DIR"
rm -f ./*.deb
if ! apt-get download $PACKAGES; then
    echo "gpu/fetch_debs.sh: apt-get download failed; refresh the package lists (as root:" \
         "apt-get update) and run it again" >&2
    exit 1
fi
ls -l
