"""The cache as jobs see it: URL prefix, proxy plugin environment, opt-out."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.data.xcache import cache_url, excluded_domains, host_of, proxy_environment
from provisioner.pilot import params, workfiles, wrapper

CACHE = "root://fra-cache:1094"
hosts = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5}){0,2}", fullmatch=True)
paths = st.from_regex(r"/[A-Za-z0-9_./-]{0,30}", fullmatch=True)


def test_proxy_environment_names_the_plugin_the_cache_and_local_names() -> None:
    env = proxy_environment(CACHE, ["gsi-storage.example.org"])
    assert env == {
        "XCACHE": CACHE,
        "XRD_PLUGIN": "libXrdClProxyPlugin-5.so",
        "XROOT_PROXY": "root://fra-cache:1094//",
        "XROOT_PROXY_EXCL_DOMAINS": "fra-cache,gsi-storage.example.org,localhost,"
                                    "localhost.localdomain",
    }


def test_excluded_domains_has_no_duplicates() -> None:
    assert excluded_domains(CACHE, ["localhost", "fra-cache", "x.org"]) == [
        "fra-cache", "localhost", "x.org", "localhost.localdomain"]


@given(hosts, paths)
def test_cache_url_prefixes_once(origin: str, path: str) -> None:
    url = f"root://{origin}:1094/{path}"
    once = cache_url(url, CACHE)
    assert once == f"{CACHE}//{url}"
    assert cache_url(once, CACHE) == once  # idempotent


@pytest.mark.parametrize("url", ["https://host/file", "/local/file", "file:///x", "davs://h//p"])
def test_cache_url_leaves_other_urls_alone(url: str) -> None:
    assert cache_url(url, CACHE) == url


def test_cache_url_without_a_cache_is_unchanged() -> None:
    assert cache_url("root://origin//data/x", None) == "root://origin//data/x"


def test_host_of() -> None:
    assert host_of("root://user@a.b.org:1094//x") == "a.b.org"
    with pytest.raises(ValueError, match="not a root:// URL"):
        host_of("https://a/b")


def _params(tmp_path: Path, xcache: str | None) -> params.PilotParams:
    return params.PilotParams(
        site="frankfurt", provisioner_id="p", collector="cm:9618", uid_domain="d",
        image="/img.sif", condor_config=tmp_path / "c",
        job_id="7", cpus=4, memory_mb=8000, walltime_end=10_000, shutdown_margin_s=60,
        noclaim_shutdown_s=600, start_delay_max_s=0, scratch=tmp_path, log_dir=None,
        xcache=xcache, xcache_exclude=("storage.site",))


def test_pilot_gives_every_job_the_proxy_environment(tmp_path: Path) -> None:
    conf = params.local_config(_params(tmp_path, CACHE), tmp_path / "w")
    line = next(x for x in conf.splitlines() if x.startswith("STARTER_JOB_ENVIRONMENT"))
    assert "XRD_PLUGIN=libXrdClProxyPlugin-5.so" in line
    assert "XROOT_PROXY=root://fra-cache:1094//" in line
    assert "XROOT_PROXY_EXCL_DOMAINS=fra-cache,storage.site,localhost" in line
    assert "XCACHE=root://fra-cache:1094" in line
    assert f"FILETRANSFER_PLUGINS = $(FILETRANSFER_PLUGINS) {tmp_path / 'w'}/xrootd-transfer" \
        in conf


def test_pilot_without_cache_sets_no_proxy(tmp_path: Path) -> None:
    p = _params(tmp_path, None)
    assert "XROOT_PROXY" not in params.local_config(p, tmp_path)
    assert params.container_env(p) == {}


def test_params_read_the_exclusions(tmp_path: Path) -> None:
    env = {"PILOT_SITE": "s", "PILOT_PROVISIONER_ID": "p", "PILOT_COLLECTOR": "cm",
           "PILOT_UID_DOMAIN": "d", "PILOT_IMAGE": "/i", "PILOT_TOKEN_FILE": "/t",
           "PILOT_CONDOR_CONFIG": "/c", "SLURM_JOB_ID": "1", "PILOT_WALLTIME_S": "60",
           "PILOT_XCACHE": CACHE, "PILOT_XCACHE_EXCLUDE": "a.org,b"}
    assert params.params_from_env(env, 0).xcache_exclude == ("a.org", "b")


def _run_plugin(tmp_path: Path, job_ad: str | None) -> str:
    """Run the transfer plugin with a stand-in xrdcp that prints its environment."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "xrdcp"
    fake.write_text('#!/bin/sh\necho "args=$*"\necho "proxy=${XROOT_PROXY:-none}"\n')
    fake.chmod(0o755)
    plugin = tmp_path / "xrootd-transfer"
    plugin.write_text(workfiles.source(workfiles.TRANSFER_PLUGIN))
    plugin.chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", **proxy_environment(CACHE)}
    if job_ad is not None:
        (tmp_path / "job.ad").write_text(job_ad)
        env["_CONDOR_JOB_AD"] = str(tmp_path / "job.ad")
    out = subprocess.run([str(plugin), "root://origin//data/f", str(tmp_path / "f")], env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout


def test_transfer_plugin_describes_itself(tmp_path: Path) -> None:
    plugin = tmp_path / "p"
    plugin.write_text(workfiles.source(workfiles.TRANSFER_PLUGIN))
    plugin.chmod(0o755)
    out = subprocess.run([str(plugin), "-classad"], capture_output=True, text=True, check=True)
    assert 'SupportedMethods = "root"' in out.stdout.splitlines()


def test_transfer_plugin_reads_through_the_cache(tmp_path: Path) -> None:
    out = _run_plugin(tmp_path, 'Owner = "alice"\n')
    assert f"args=--nopbar --force root://origin//data/f {tmp_path / 'f'}" in out
    assert "proxy=root://fra-cache:1094//" in out


def test_transfer_plugin_honours_the_opt_out(tmp_path: Path) -> None:
    assert "proxy=none" in _run_plugin(tmp_path, 'Owner = "alice"\nWantXCache = false\n')


def test_job_wrapper_opt_out_unsets_the_proxy(tmp_path: Path) -> None:
    """The opt-out part of the job wrapper, run up to the namespace step."""
    head = workfiles.source(workfiles.JOB_WRAPPER).split("ns=; pending=", 1)[0]
    script = head + 'echo "proxy=${XROOT_PROXY:-none} plugin=${XRD_PLUGIN:-none}"\n'
    ad = tmp_path / "job.ad"
    base = {"PATH": "/usr/bin:/bin", **proxy_environment(CACHE), "_CONDOR_JOB_AD": str(ad)}
    for text, want in [("WantXCache = false\n", "proxy=none plugin=none"),
                       ("WantXCache = true\n", "proxy=root://fra-cache:1094//"),
                       ("Owner = \"alice\"\n", "proxy=root://fra-cache:1094//")]:
        ad.write_text(text)
        out = subprocess.run(["/bin/sh", "-c", script], env=base, capture_output=True,
                             text=True, check=True).stdout
        assert want in out, (text, out)
    assert os.path.exists(ad)


def test_pilot_binds_the_sites_shared_directories_read_only(tmp_path: Path) -> None:
    p = params.PilotParams(**{**_params(tmp_path, CACHE).__dict__, "bind": ("/srv/shared",)})
    pilot = wrapper.PilotRun(p, tmp_path / "w", tmp_path / "w" / "condor_config")
    assert pilot._binds() == [str(tmp_path / "w"), "/srv/shared:/srv/shared:ro"]
    env = {"PILOT_SITE": "s", "PILOT_PROVISIONER_ID": "p", "PILOT_COLLECTOR": "cm",
           "PILOT_UID_DOMAIN": "d", "PILOT_IMAGE": "/i", "PILOT_TOKEN_FILE": "/t",
           "PILOT_CONDOR_CONFIG": "/c", "SLURM_JOB_ID": "1", "PILOT_WALLTIME_S": "60",
           "PILOT_BIND": "/a,/b/c"}
    assert params.params_from_env(env, 0).bind == ("/a", "/b/c")


def test_a_cache_value_cannot_inject_into_the_pilot_config(tmp_path: Path) -> None:
    p = _params(tmp_path, CACHE + "$(LIB)\nSTART = True")
    conf = params.local_config(p, tmp_path / "w")
    assert "$(LIB)" not in conf and "\nSTART = True" not in conf, conf
