#!/bin/bash
# Set-up that needs the running daemons: IDTOKENS for each identity, and the
# pilot Apptainer image (built once per image definition and rootfs, cached).
set -euo pipefail
export PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin

# The collector creates the pool's token signing key on its first start.
for _ in $(seq 300); do [ -s /etc/condor/passwords.d/POOL ] && break; sleep 0.1; done
[ -s /etc/condor/passwords.d/POOL ] || { echo "no token signing key" >&2; exit 1; }

token() {  # identity, file, owner, [authz...]
    local identity=$1 file=$2 owner=$3
    shift 3
    local authz=()
    for a in "$@"; do authz+=(-authz "$a"); done
    (umask 077 && condor_token_create -identity "$identity" "${authz[@]}" >"$file.tmp")
    chown "$owner:" "$file.tmp"
    chmod 0400 "$file.tmp"
    mv "$file.tmp" "$file"
}
# The pool's own daemons, when they call out to pilot startds (claims via CCB).
token condor@testbed /etc/condor/tokens.d/condor root
# The provisioner service (its own unprivileged account): it reads the pool, and
# asks the schedd for a negotiation when a pilot joins (condor_reschedule needs
# WRITE), and advertises its status ad to the collector (DAEMON); releases go
# through SLURM.
install -d -o provisioner -g provisioner -m 0700 /etc/provisioner/tokens.d
# ADMINISTRATOR: the collector alone grants it to the provisioner, which has it
# re-read the list of live pilot tokens (condor_config/central-manager.conf).
token provisioner@testbed /etc/provisioner/tokens.d/provisioner provisioner \
    READ WRITE DAEMON ADMINISTRATOR
# The same identity for root on cm (tests, the demo, an admin's tools): HTCondor
# reads a token only from a file its reader owns.
install -d -m 0700 /root/.condor/tokens.d
install -m 0400 /etc/provisioner/tokens.d/provisioner /root/.condor/tokens.d/provisioner
# frankfurt is reached through slurmrestd only: the pilot account's JWT, for a
# day (the testbed's life); tests mint shorter ones.
/src/deploy/testbed/inside/mint-jwt 86400 /etc/provisioner/tokens.d/frankfurt.jwt
# Pilots: no shared token any more. The provisioner mints each pilot's own with
# the pilot signing key (docs/security.md): its copy is readable by the service's
# account only, the collector's by root only (condor_config/central-manager.conf).
rm -f /etc/provisioner/pilot.token
install -d -o provisioner -g provisioner -m 0700 /etc/provisioner/pilot-keys
install -d -m 0700 /etc/condor/pilot-keys.d
if [ ! -s /etc/provisioner/pilot-keys/pilot-1 ]; then
    (umask 077 && head -c 64 /dev/urandom >/etc/provisioner/pilot-keys/pilot-1.tmp)
    chown provisioner: /etc/provisioner/pilot-keys/pilot-1.tmp
    mv /etc/provisioner/pilot-keys/pilot-1.tmp /etc/provisioner/pilot-keys/pilot-1
fi
install -m 0600 /etc/provisioner/pilot-keys/pilot-1 /etc/condor/pilot-keys.d/pilot-1
# The live pilot tokens' list (written by the service, read by the collector).
install -d -o provisioner -g provisioner -m 0755 /var/lib/provisioner
# The collector accepts no other token than these two (and pilots'): whatever else
# the pilot key's holder mints is refused (condor_config/central-manager.conf).
jtis=$(for f in /etc/condor/tokens.d/condor /etc/provisioner/tokens.d/provisioner; do
    python3 -c 'import base64, json, sys
p = open(sys.argv[1]).read().split(".")[1]
print(json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))["jti"])' "$f"
done | tr '\n' ' ')
echo "PROVISIONER_OTHER_TOKENS_REVOKED = !stringListMember(jti, \"${jtis% }\", \" \")" \
    >/etc/condor/config.d/95-testbed-tokens.conf
condor_reconfig -collector >/dev/null

# The Apptainer images: /opt/images/NAME.sif from /src/images/NAME.def and a base
# tree, built once per definition and rootfs (cached), as the pilot account:
# Apptainer builds unprivileged only (a definition file implies --fakeroot; %post
# runs in a user namespace), and the images must be what a site account can build.
build_image() {  # name, base tree
    local name=$1 base=$2 key sif work
    key=$(cat "/src/images/$name.def" /etc/testbed-rootfs-key 2>/dev/null | sha256sum | cut -c1-12)
    sif=/opt/images/$name-$key.sif
    if [ ! -s "$sif" ]; then
        echo "building the $name image $sif"
        # An unprivileged build copies the base tree: it must hold no device
        # nodes and nothing the pilot account cannot read.
        find "$base/dev" -mindepth 1 -delete
        find "$base" -xdev \( -type f ! -perm -o+r -exec chmod o+r {} + \) -o \
            \( -type d ! -perm -o+rx -exec chmod o+rx {} + \)
        work=$(runuser -u pilot -- mktemp -d "/var/tmp/$name-image.XXXXXX")
        runuser -u pilot -- env -C "$work" APPTAINER_TMPDIR="$work" \
            apptainer -q build --build-arg "base=$base" "$work/$name.sif" "/src/images/$name.def"
        mv "$work/$name.sif" "$sif.tmp"
        mv "$sif.tmp" "$sif"
        rm -rf "$work"
        # Other keys' images may belong to a testbed still up from another
        # checkout or rootfs (the cache is shared): only those unused
        # for a week go.
        find /opt/images -name "$name-*.sif" ! -name "$name-$key.sif" -mtime +7 -delete
    fi
    touch "$sif"  # its mtime is its last use: what the clean-up above reads
    ln -sfn "$sif" "/opt/images/$name.sif"
}
build_image pilot /opt/testbed/pilot-base
# The example payload (images/payload.def); its %test runs during the build.
build_image payload /opt/testbed/payload-base

# The provisioner itself, from the repository mounted at /src.
/opt/venv/bin/pip install -q --no-deps --no-build-isolation --disable-pip-version-check -e /src
