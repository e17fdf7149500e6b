"""`provisioner init [--dir /etc/provisioner]`: the service's configuration directory.

Writes a commented configuration skeleton (never over an existing one), creates the
directory layout with its owners and modes, and prints the commands left to run (the
service's token, the pilots' signing key and the SSH key, which need the central
manager and the sites' admins). It creates no secret itself. Runs as root to set owners; otherwise
the files are the caller's own.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from provisioner.onboard.data import data_dir

SERVICE_USER = "provisioner"


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the directory
    mode: int
    private: bool  # owned by the service account (else root / the caller)


#: The layout: the configuration (root's, readable by the service), the token and SSH
#: directories (the service's own, nobody else's).
LAYOUT = (
    Entry(".", 0o755, False),
    Entry("tokens.d", 0o700, True),
    Entry("pilot-keys", 0o700, True),
    Entry("ssh", 0o700, True),
)

SKELETON = """\
# The provisioner's configuration (written by `provisioner init`; see
# deploy/provisioner.example.yaml for every field). Check it with
#   provisioner -c {config} check-config
pool:
  collector: "cm.example.org:9618"        # the central manager: collector + CCB
  # IDTOKEN of provisioner@<uid_domain>; its directory must hold only this token
  token_file: {dir}/tokens.d/provisioner
  provisioner_id: prov-1                  # pilots carry it in their job name and ad
  uid_domain: example.org                 # identities are user@uid_domain
journal: /var/lib/provisioner/journal.sqlite
# Each pilot gets its own token, minted at submit with this key (docs/security.md).
pilot_tokens:
  signing_key: {dir}/pilot-keys/pilot-1
  live_list: /var/lib/provisioner/pilot-tokens.live
# templates_dir: {dir}/slurm_templates   # a site's own batch scripts (default: the
#                                         # templates shipped in the package)
sites:
# One block per site: `provisioner site discover --host LOGIN --user ACCOUNT
#   --slurm-conf ... --image ...` prints it from what the site's SLURM says;
# paste it here, then `provisioner site check NAME`.
  []
"""


def _ids(owner: str | None) -> tuple[int, int] | None:
    if owner is None:
        return None
    try:
        pw = pwd.getpwnam(owner)
    except KeyError:
        return None
    try:
        gid = grp.getgrnam(owner).gr_gid
    except KeyError:
        gid = pw.pw_gid
    return pw.pw_uid, gid


def make_layout(directory: Path, owner: str | None) -> list[str]:
    """Create the directories with their modes (and owners, as root); what was done."""
    ids = _ids(owner) if os.geteuid() == 0 else None
    done = []
    for entry in LAYOUT:
        path = (directory / entry.path).resolve()
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(entry.mode)
        if entry.private and ids is not None:
            os.chown(path, *ids)
        who = owner if entry.private and ids is not None else "unchanged owner"
        done.append(f"{path}/ mode {entry.mode:04o} ({who})")
    return done


def write_skeleton(directory: Path) -> tuple[Path, bool]:
    """provisioner.yaml (mode 0644) unless one exists; (path, whether written)."""
    config = directory.resolve() / "provisioner.yaml"
    if config.exists():
        return config, False
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(SKELETON.format(dir=directory.resolve(), config=config))
    config.chmod(0o644)
    return config, True


def next_steps(directory: Path, owner: str) -> str:
    d = directory.resolve()
    cm = data_dir("condor_config")
    return f"""\
Left to do (none of these secrets is made by init):
1. On the central manager (with the pool's signing key), the service's token:
     condor_token_create -identity provisioner@DOMAIN -authz READ -authz WRITE \\
       -authz DAEMON -authz ADMINISTRATOR > {d}/tokens.d/provisioner
     chown {owner}: {d}/tokens.d/provisioner && chmod 600 {d}/tokens.d/provisioner
   and the key the service signs each pilot's own token with (no site holds a pool
   token: docs/security.md), one copy for the service, one for the collector only:
     (umask 077; head -c 64 /dev/urandom > {d}/pilot-keys/pilot-1)
     chown {owner}: {d}/pilot-keys/pilot-1
     install -m 0600 -D {d}/pilot-keys/pilot-1 /etc/condor/pilot-keys.d/pilot-1
   (central manager configuration: {cm}/central-manager.conf, with the include of
   the live pilot tokens it describes; the pilots': {cm}/pilot.conf at each site's
   runtime.condor_config)
2. The SSH key the sites authorise for their pilot account:
     runuser -u {owner} -- ssh-keygen -t ed25519 -N "" -f {d}/ssh/id_ed25519
   send {d}/ssh/id_ed25519.pub to each site (authorized_keys, prefixed `restrict`);
   each login node's host key, checked with the site's fingerprint:
     ssh-keyscan LOGIN >> {d}/ssh/known_hosts; ssh-keygen -lf {d}/ssh/known_hosts
3. provisioner site discover --host LOGIN --user ACCOUNT [--partition P]
   --slurm-conf ... --image ...   (paste the block into {d}/provisioner.yaml)
4. provisioner -c {d}/provisioner.yaml site check
5. systemctl enable --now provisioner   (deploy/provisioner.service)
"""


def init(directory: Path, owner: str = SERVICE_USER) -> str:
    """Make the layout and the skeleton; the report to print."""
    lines = make_layout(directory, owner)
    config, written = write_skeleton(directory)
    lines.append(f"{config} " + ("written (mode 0644)" if written else
                                 "exists: left unchanged"))
    if os.geteuid() == 0 and _ids(owner) is None:
        lines.append(f"warning: no account {owner!r} here: create it first "
                     f"(useradd -r -m -d /var/lib/provisioner {owner}) and run init again")
    return "\n".join(lines) + "\n\n" + next_steps(directory, owner)
