"""The executors: what reaches the remote shell, and how ssh's failures are told."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.config import BACKEND_SETTINGS, KNOWN_BACKENDS
from provisioner.errors import Transient, Unreachable
from provisioner.sites import BACKENDS
from provisioner.sites.executor import LocalExecutor, SshExecutor, remote_command

HOSTILE = ["; rm -rf /", "$(touch /tmp/pwned)", "`id`", "a b", "'quoted'", '"dq"', "x\ny",
           "*", "~", "&&", "|", "$HOME", "\\"]

ARGV_OF = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('V')]))"


def _through_a_shell(command: str) -> str:
    """What a remote login shell would run: `sh -c COMMAND`."""
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                          check=True, env={"PATH": os.environ["PATH"]}).stdout


@pytest.mark.parametrize("word", HOSTILE)
def test_every_word_reaches_the_remote_command_literally(word: str) -> None:
    import json

    command = remote_command([sys.executable, "-c", ARGV_OF, word, "--x=" + word],
                             {"V": word})
    assert json.loads(_through_a_shell(command)) == [[word, "--x=" + word], word]


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                               blacklist_characters="\x00"), max_size=20),
                max_size=4))
def test_any_argv_survives_the_remote_shell(words: list[str]) -> None:
    import json

    out = _through_a_shell(remote_command([sys.executable, "-c", ARGV_OF, *words], {}))
    assert json.loads(out)[0] == words


def test_environment_names_are_validated() -> None:
    with pytest.raises(ValueError, match="not an environment variable name"):
        remote_command(["true"], {"X; rm -rf /": "1"})


def ssh(tmp_path: Path, **kw: object) -> SshExecutor:
    key = tmp_path / "key"
    key.write_text("k")
    known = tmp_path / "known_hosts"
    known.write_text("")
    return SshExecutor(site="gsi", host="gsi-login", user="pilot", key_file=str(key),
                       known_hosts=str(known), control_dir=str(tmp_path / "c"), **kw)


def test_ssh_options_are_strict_and_multiplexed(tmp_path: Path) -> None:
    argv = ssh(tmp_path).ssh_argv()
    opts = {argv[i + 1] for i, a in enumerate(argv) if a == "-o"}
    for wanted in ("BatchMode=yes", "StrictHostKeyChecking=yes", "IdentitiesOnly=yes",
                   f"UserKnownHostsFile={tmp_path}/known_hosts", "ControlMaster=auto",
                   "ControlPersist=600", "GlobalKnownHostsFile=/dev/null",
                   "PasswordAuthentication=no"):
        assert wanted in opts
    assert argv[-1] == "gsi-login" and argv[:3] == ["ssh", "-F", "none"]
    assert len(ssh(tmp_path).control_path) < 100


@pytest.mark.parametrize(("stderr", "says"), [
    ("Host key verification failed.", "wrong or unknown host key of gsi-login"),
    ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@", "wrong or unknown host key"),
    ("pilot@gsi-login: Permission denied (publickey).", "login as pilot@gsi-login refused"),
    ("ssh: Could not resolve hostname gsi-login: Name or service not known", "unknown host"),
    ("ssh: connect to host gsi-login port 22: Connection refused", "cannot connect"),
    ("ssh: connect to host gsi-login port 22: Connection timed out", "cannot connect"),
    ("something else", "ssh to pilot@gsi-login:22 failed"),
])
def test_ssh_failures_are_unreachable_and_named(tmp_path: Path, stderr: str,
                                                says: str) -> None:
    assert says in ssh(tmp_path).describe_failure(stderr)


def test_missing_key_or_known_hosts_is_unreachable_naming_the_site(tmp_path: Path) -> None:
    ex = ssh(tmp_path)
    Path(ex.key_file).unlink()
    with pytest.raises(Unreachable, match=r"site gsi: SSH key .* is missing"):
        ex.run(["true"], {})


def test_local_timeout_is_transient() -> None:
    with pytest.raises(Transient, match="timed out"):
        LocalExecutor(timeout_s=0.2).run(["sleep", "5"], {"PATH": os.environ["PATH"]})
    with pytest.raises(Unreachable, match="not found"):
        LocalExecutor().run(["/nonexistent/sbatch"], {})


def test_backend_registry_and_settings_name_the_same_backends() -> None:
    assert set(BACKENDS) == set(BACKEND_SETTINGS) == set(KNOWN_BACKENDS)
