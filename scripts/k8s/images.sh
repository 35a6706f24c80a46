#!/bin/bash
# Build two single-layer OCI image tarballs with no registry: a pause image (tiny static C program) and a
# busybox image from Debian's busybox-static. cluster.sh imports every $K/images/*.tar into containerd (k8s.io ns).
set -euo pipefail
K=${K:-/var/cache/sbx-k8s}; D=$K/images; mkdir -p $D; cd $D
mkimage() { # ROOTFS REF OUT ENTRYPOINT_JSON CMD_JSON
  local root=$1 ref=$2 out=$3 ep=$4 cmd=$5 w; w=$(mktemp -d); mkdir -p $w/blobs/sha256
  tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$root" -cf $w/l .
  local ld=$(sha256sum $w/l | cut -d' ' -f1) ls=$(stat -c %s $w/l); mv $w/l $w/blobs/sha256/$ld
  printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s,"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$ep" "$cmd" $ld > $w/c
  local cd=$(sha256sum $w/c | cut -d' ' -f1) cs=$(stat -c %s $w/c); mv $w/c $w/blobs/sha256/$cd
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' $cd $cs $ld $ls > $w/m
  local md=$(sha256sum $w/m | cut -d' ' -f1) ms=$(stat -c %s $w/m); mv $w/m $w/blobs/sha256/$md
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' $md $ms "$ref" "${ref##*:}" > $w/index.json
  echo '{"imageLayoutVersion":"1.0.0"}' > $w/oci-layout
  tar -C $w -cf "$out" oci-layout index.json blobs; rm -rf $w
}
cat > pause.c <<'EOC'
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void sigdown(int s) { psignal(s, "Shutting down, got signal"); exit(0); }
static void sigreap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0); }
int main(void) {
  struct sigaction a = {.sa_handler = sigdown}, r = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &a, NULL); sigaction(SIGTERM, &a, NULL); sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}
EOC
rm -rf rfs-pause rfs-bb; mkdir -p rfs-pause; gcc -Os -static -s -o rfs-pause/pause pause.c
mkimage rfs-pause registry.k8s.io/pause:3.10 pause.tar '["/pause"]' null
mkdir -p rfs-bb/bin rfs-bb/tmp rfs-bb/etc rfs-bb/proc rfs-bb/sys rfs-bb/dev rfs-bb/www; chmod 1777 rfs-bb/tmp
cp /bin/busybox rfs-bb/bin/busybox   # Debian busybox-static
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox rfs-bb/bin/$a; done
echo 'root:x:0:0:root:/root:/bin/sh' > rfs-bb/etc/passwd; echo 'root:x:0:' > rfs-bb/etc/group
echo hello-from-pod > rfs-bb/www/index.html
mkimage rfs-bb docker.io/library/busybox:local busybox.tar null '["sh"]'
# pybox: busybox plus Debian's python3 (binary, its libraries and the standard library without tests): the
# conformance suite's isolation checks run python3 in the box.
PY=$(readlink -f /usr/bin/python3); PYV=$(basename $PY); mkdir -p rfs-py/root rfs-py/home
cp -a rfs-bb/. rfs-py/; chmod 700 rfs-py/root; mkdir -p rfs-py/usr/bin rfs-py/usr/lib; cp $PY rfs-py/usr/bin/$PYV; ln -s $PYV rfs-py/usr/bin/python3
tar -C /usr/lib --exclude=test --exclude=__pycache__ --exclude=idlelib --exclude=tkinter --exclude=ensurepip -cf - $PYV | tar -C rfs-py/usr/lib -xf -
for f in $PY /usr/lib/$PYV/lib-dynload/*.so; do ldd $f 2>/dev/null; done | awk '/=> \//{print $3} /^\s*\/lib64/{print $1}' | sort -u |
  while read l; do mkdir -p rfs-py$(dirname $l); cp -L $l rfs-py$l; d=$(readlink -f $l); done
mkdir -p rfs-py/lib64 rfs-py/lib/x86_64-linux-gnu; cp -L /lib64/ld-linux-x86-64.so.2 rfs-py/lib64/
mkimage rfs-py sbx.local/pybox:1 pybox.tar null '["sh"]'
rm -rf rfs-pause rfs-bb rfs-py pause.c; ls -la $D
