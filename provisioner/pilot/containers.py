"""Jobs in their own containers on a pilot: HTCondor's native container support,
switched on only where it works.

At start the pilot tests the node: inside its own container it runs ``apptainer
exec`` of an image (the pilot's own image by default) with the options the starter
will use. Only if that succeeds does the pilot's configuration name Apptainer as
HTCondor's ``SINGULARITY``; the startd then runs its own launch test and advertises
``HasSingularity``, ``HasContainer``, ``HasSIF`` and ``HasSandboxImage``. If it fails,
``SINGULARITY`` stays empty: the startd advertises no container support, container
jobs never match this pilot, and the reason is in the pilot's log and its ad
(``PilotContainerTest``).

The test runs before the master where a cached pass stands (it is then only read) or
where every job runs in a container (a site's payload image); elsewhere it runs beside
the master (`defer_test`): the startd starts with containers off and says so
(`pending_config`), plain jobs run at once, and container support is switched on once
the test passed.

Jobs that ask for a container: ``container_image`` (a ``.sif`` file or a directory,
on a shared path the site binds into pilots or transferred from the submit host) and
``+SingularityImage``. Registry images (``docker://``...) are refused by the submit
side's configuration (condor_config/): worker nodes reach no registry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: Where the pilot image has Apptainer (images/pilot.def installs it).
APPTAINER = "/usr/bin/apptainer"

#: Dynamic-loader settings a site may set by default (one that intercepted the loader,
#: LD_AUDIT, made containers 3x slower), plain and in the forms Apptainer injects into
#: containers: the batch script and the pilot drop them before anything starts.
LOADER_VARIABLES = tuple(prefix + name for prefix in ("", "SINGULARITYENV_", "APPTAINERENV_")
                         for name in ("LD_AUDIT", "LD_PRELOAD"))

#: How the pilot's ad (``PilotContainerTest``) begins while the test runs beside the
#: master; "ok: " or "failed: " once it ended.
RUNNING = "running: "

#: A command in the pilot's container: argv -> (exit status, output).
Execute = Callable[[list[str]], tuple[int, str]]


@dataclass(frozen=True)
class ContainerSupport:
    ok: bool
    detail: str  # "apptainer exec of IMAGE: 0.4 s" or why it failed
    seconds: float = 0.0


def self_test_argv(image: str, apptainer: str = APPTAINER) -> list[str]:
    """The start-up test's command in the pilot's container."""
    return [apptainer, "-s", "exec", "--contain", "--cleanenv", "--no-home", "--pid",
            image, "/bin/true"]


def self_test(execute: Execute, image: str, apptainer: str = APPTAINER,
              clock: Callable[[], float] = time.monotonic) -> ContainerSupport:
    """Run ``apptainer exec IMAGE /bin/true`` nested in the pilot's container."""
    if not image:
        return ContainerSupport(False, "no test image")
    argv = self_test_argv(image, apptainer)
    start = clock()
    try:
        rc, out = execute(argv)
    except Exception as exc:  # spython raises on a missing binary or image
        return ContainerSupport(False, f"apptainer exec of {image}: {exc}")
    seconds = clock() - start
    if rc != 0:
        text = " | ".join(line.strip() for line in out.splitlines() if line.strip())[-300:]
        return ContainerSupport(False, f"apptainer exec of {image} failed (exit {rc}): "
                                       f"{text or 'no output'}", seconds)
    return ContainerSupport(True, f"apptainer exec of {image}: {seconds:.1f} s", seconds)


def config_string(value: str) -> str:
    """A ClassAd string literal safe as an HTCondor config value: one line, and no
    ``$`` (the config language would expand ``$(...)``)."""
    value = "".join(c if c.isprintable() and c != "$" else " " for c in value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def container_config(support: ContainerSupport, payload_image: str = "",
                     apptainer: str = APPTAINER) -> dict[str, str]:
    """The pilot-local HTCondor settings for the test's outcome.

    Passed: Apptainer is HTCondor's ``SINGULARITY``; with a site's default payload
    image, jobs that name no image run in it (``SINGULARITY_JOB`` for all). Failed:
    ``SINGULARITY`` is empty, so the startd advertises no container support. Either
    way the outcome is in the pilot's ad (``PilotContainerTest``)."""
    settings = {"PilotContainerTest": config_string(("ok: " if support.ok else "failed: ")
                                                      + support.detail),
                "STARTD_ATTRS": "$(STARTD_ATTRS) PilotContainerTest"}
    if not support.ok:
        return {"SINGULARITY": "", **settings}
    settings["SINGULARITY"] = apptainer
    if payload_image:
        settings["SINGULARITY_JOB"] = "true"
        settings["SINGULARITY_IMAGE_EXPR"] = (
            f"ifThenElse(isUndefined(TARGET.SingularityImage), "
            f"{config_string(payload_image)}, TARGET.SingularityImage)")
    return settings


def defer_test(payload_image: str, cached_pass: bool) -> bool:
    """Whether the start-up test runs beside the master rather than before it: only
    where no cached pass stands and the site sets no payload image (with one, every
    job runs in a container, so none may start before the test has passed)."""
    return not cached_pass and not payload_image


def pending_config(image: str) -> dict[str, str]:
    """The pilot-local HTCondor settings while the test runs beside the master:
    ``SINGULARITY`` empty (HTCondor's default names a binary that may exist, and the
    startd would advertise what nobody tested), and the pilot's ad says the test runs."""
    return {"SINGULARITY": "",
            "PilotContainerTest": config_string(
                f"{RUNNING}apptainer exec of {image or 'no test image'}, beside the "
                "master; no container jobs until it passed"),
            "STARTD_ATTRS": "$(STARTD_ATTRS) PilotContainerTest"}
