#!/usr/bin/env bash
# Builds the Tessera image from daemonset/image/Containerfile:
#   hack/build-image.sh                 # ghcr.io/tessera-io/tessera:<Cargo.toml version>
#   IMAGE=registry.example/tessera:dev hack/build-image.sh
#   BUILDER=docker hack/build-image.sh  # default: podman, else buildah, else docker
#   NO_IMAGE=1 hack/build-image.sh      # only the build context (target/image/)
#   PROFILE=dev hack/build-image.sh     # debug build (a quick check of this script)
# Steps: release build of `tessera`, `tessera-node` (the node agent alone, which the
# DaemonSet runs; `node` profile) and the shim (libtessera_cuda.so); a root file system with the binaries
# at /usr/bin/tessera and /usr/bin/tessera-node, the shim at /usr/lib/tessera/ (where the
# agent installs it on the host from), the binary's shared libraries exactly as `ldd`
# lists them, and /etc/passwd and /etc/group naming root and nonroot (65532); then
# `<builder> build` on that context, which needs no network. Run it on the oldest glibc
# you support for workloads: the shim is loaded into GPU containers of any image.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
IMAGE=${IMAGE:-ghcr.io/tessera-io/tessera:$version}

PROFILE=${PROFILE:-release}
# The node agent is built with the `node` profile (release, optimised for size: its
# resident memory is mostly code pages; Cargo.toml), everything else with `release`.
case "$PROFILE" in
  release) out=target/release node_profile=node node_out=target/node ;;
  dev) out=target/debug node_profile=dev node_out=target/debug ;;
  *) echo "build-image: PROFILE is release or dev" >&2; exit 1 ;;
esac
# Separate builds, so each package gets its own features (and each binary is the one
# `cargo build --release --bin tessera` or `cargo build --profile node --bin tessera-node`
# makes).
cargo build --profile "$PROFILE" --locked --bin tessera
cargo build --profile "$node_profile" --locked --bin tessera-node
cargo build --profile "$PROFILE" --locked -p tessera-cuda --lib
bin=$out/tessera
node_bin=$node_out/tessera-node
shim=$out/libtessera_cuda.so
for f in "$bin" "$node_bin" "$shim"; do
  [ -f "$f" ] || { echo "build-image: $f was not built" >&2; exit 1; }
done

ctx=target/image
rm -rf "$ctx"
root=$ctx/rootfs
mkdir -p "$root/usr/bin" "$root/usr/lib/tessera" "$root/etc/ld.so.conf.d" \
  "$root/usr/lib/x86_64-linux-gnu" "$root/tmp"
chmod 1777 "$root/tmp"
# Debug info stays in target/; the image gets stripped copies.
objcopy --strip-debug "$bin" "$root/usr/bin/tessera"
objcopy --strip-debug "$node_bin" "$root/usr/bin/tessera-node"
objcopy --strip-debug "$shim" "$root/usr/lib/tessera/libtessera_cuda.so"
chmod 0755 "$root/usr/bin/tessera" "$root/usr/bin/tessera-node" \
  "$root/usr/lib/tessera/libtessera_cuda.so"
# The binaries' shared libraries, at the paths the dynamic loader looks for them.
libs=$(ldd "$bin" "$node_bin" | awk '/=> \// { print $3 } /^[ \t]*\/[^ ]*ld-linux/ { print $1 }' | sort -u)
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
if ldd "$bin" "$node_bin" | grep -q 'not found'; then
  echo "build-image: a shared library of $bin or $node_bin is missing:" >&2
  ldd "$bin" "$node_bin" >&2
  exit 1
fi
# The NVIDIA container runtime adds its library folder here and runs ldconfig.
echo 'include /etc/ld.so.conf.d/*.conf' > "$root/etc/ld.so.conf"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  > "$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
cp daemonset/image/Containerfile "$ctx/Containerfile"
echo "build context: $ctx ($(du -sh "$root" | cut -f1))"
[ -n "${NO_IMAGE:-}" ] && exit 0

if [ -z "${BUILDER:-}" ]; then
  for b in podman buildah docker; do
    if command -v "$b" >/dev/null 2>&1; then BUILDER=$b; break; fi
  done
fi
if [ -z "${BUILDER:-}" ]; then
  echo "build-image: no podman, buildah or docker; the context is in $ctx" >&2
  exit 1
fi
case "$BUILDER" in
  buildah) buildah bud -f "$ctx/Containerfile" -t "$IMAGE" "$ctx" ;;
  *) "$BUILDER" build -f "$ctx/Containerfile" -t "$IMAGE" "$ctx" ;;
esac
echo "built $IMAGE with $BUILDER"

# Smoke test: the image's entrypoint runs. Where the builder cannot start containers (a
# sandbox that refuses setrlimit, say), run it from the exported file system instead.
if "$BUILDER" run --rm "$IMAGE" --help >/dev/null 2>&1; then
  echo "smoke test: $BUILDER run $IMAGE --help ok"
elif [ "$(id -u)" = 0 ] && [ "$BUILDER" != buildah ]; then
  fs=$ctx/exported
  mkdir -p "$fs"
  cid=$("$BUILDER" create "$IMAGE")
  "$BUILDER" export "$cid" | tar -x -C "$fs"
  "$BUILDER" rm "$cid" >/dev/null
  chroot "$fs" /usr/bin/tessera --help >/dev/null
  chroot "$fs" /usr/bin/tessera-node --help >/dev/null
  echo "smoke test: /usr/bin/tessera and tessera-node --help ok in the exported image (containers cannot start here)"
else
  echo "build-image: the image does not run: $BUILDER run --rm $IMAGE --help" >&2
  exit 1
fi
