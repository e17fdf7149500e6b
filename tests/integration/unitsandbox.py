"""Run a command the way systemd would run deploy/provisioner.service, where there is
no systemd (the testbed): the unit's own sandbox settings, read from the unit file,
applied with a private mount namespace and setpriv.

Emulated: User/Group; NoNewPrivileges; ProtectSystem=strict (every mount read-only
except the API file systems /proc, /sys, /dev); ReadWritePaths and the unit's
State-, Logs- and RuntimeDirectory (created with their modes and owner, as systemd
does, and left writable); PrivateTmp (empty /tmp and /var/tmp); ProtectHome=true
(empty, read-only /home, /root, /run/user); UMask. Not emulated (no seccomp or
capability tooling here; what they forbid the service does not do): the system call
filter, address families, capability bounds, ProtectKernel*/Clock/Hostname/Proc.
A setting the emulation does not know the value of fails loudly.

    unshare --mount --propagation private -- python3 unitsandbox.py UNIT -- ARGV...
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "deploy/provisioner.service"
API = ("/proc", "/sys", "/dev")


def unit_settings(path: Path) -> dict[str, str]:
    """The [Service] section's key=value lines (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def command(argv: list[str], unit: Path = UNIT) -> list[str]:
    """ARGV run under the unit's sandbox (as root: the emulation drops to User)."""
    return ["unshare", "--mount", "--propagation", "private", "--", sys.executable,
            str(Path(__file__).resolve()), str(unit), "--", *argv]


def _want(settings: dict[str, str], key: str, value: str) -> bool:
    got = settings.get(key)
    if got not in (None, value):
        raise SystemExit(f"unitsandbox: {key}={got}: only {key}={value} is emulated")
    return got == value


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True)


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, file system type) of this namespace's mounts."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        out.append((left.split()[4], right.split()[0]))
    return out


def _under(path: str, tops: list[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


def sandbox(settings: dict[str, str]) -> None:
    user = pwd.getpwnam(settings["User"])
    writable = settings.get("ReadWritePaths", "").split()
    for key, top in (("StateDirectory", "/var/lib"), ("LogsDirectory", "/var/log"),
                     ("RuntimeDirectory", "/run")):
        for name in settings.get(key, "").split():
            path = Path(top, name)
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, user.pw_uid, user.pw_gid)
            path.chmod(int(settings.get(key + "Mode", "0755"), 8))
            writable.append(str(path))
    for path in writable:
        _mount("--bind", path, path)  # a mount of its own: stays writable below
    if _want(settings, "PrivateTmp", "true"):
        for path in ("/tmp", "/var/tmp"):
            _mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", path)
            writable.append(path)
    if _want(settings, "ProtectHome", "true"):
        for path in ("/home", "/root", "/run/user"):
            if Path(path).is_dir():
                _mount("-t", "tmpfs", "-o", "ro,mode=0755", "tmpfs", path)
    if _want(settings, "ProtectSystem", "strict"):
        for point, fstype in _mount_points():
            if _under(point, list(API)) or _under(point, writable) or fstype == "nsfs":
                continue
            _mount("-o", "remount,bind,ro", point)


def main(args: list[str]) -> None:
    unit, sep, *argv = args
    if sep != "--" or not argv:
        raise SystemExit(__doc__)
    settings = unit_settings(Path(unit))
    sandbox(settings)
    if "UMask" in settings:
        os.umask(int(settings["UMask"], 8))
    priv = ["setpriv", f"--reuid={settings['User']}", f"--regid={settings['Group']}",
            "--init-groups"]
    if _want(settings, "NoNewPrivileges", "true"):
        priv.append("--no-new-privs")
    os.execvp(priv[0], [*priv, "--", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
