"""Render a site's pilot batch script from its Jinja2 template (slurm_templates/).

Values come from the validated configuration; every one that lands in shell
context goes through the `q` filter (shlex.quote). Per-submission sbatch
options (cores, memory, GPUs, time, name, comment, signal) are not part of the
script: the backend passes them as argv.

GPUs: a pilot with GPUs exports PILOT_GPUS (the count it asked SLURM for) and
PILOT_GPU_DISCOVERY_EXTRA into its container (Apptainer's APPTAINERENV_ prefix
passes them through --cleanenv), where condor_config/pilot.conf turns on HTCondor's
GPU discovery and gives the partitionable slot exactly PILOT_GPUS of the GPUs found.
SLURM's CUDA_VISIBLE_DEVICES (the devices it gave the job) is passed on too, so
condor_gpu_discovery reports only those. Real GPUs also need the NVIDIA driver's
libraries in the container: APPTAINER_NV=1 (``--nv``) unless the GPUs are simulated
(`runtime.gpu_discovery_extra` with ``-simulate``).
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path

import jinja2

from provisioner.config import Config, SiteBase
from provisioner.security.tokens import TOKEN_TEXT

#: Where slurm_templates/ is looked for when the config does not say (templates_dir
#: overrides): the package data of an installed wheel, then a source checkout (beside
#: the package).
DEFAULT_TEMPLATE_DIRS = (Path(__file__).resolve().parents[1] / "_data" / "slurm_templates",
                         Path(__file__).resolve().parents[2] / "slurm_templates")


class TemplateError(Exception):
    """A site's batch-script template is missing or does not render."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field  # the configuration field at fault, e.g. sites[1].template


def templates_dir(config: Config) -> Path:
    if config.templates_dir:
        return Path(config.templates_dir)
    for candidate in DEFAULT_TEMPLATE_DIRS:
        if candidate.is_dir():
            return candidate
    raise TemplateError("no slurm_templates directory found (looked in "
                        + ", ".join(str(d) for d in DEFAULT_TEMPLATE_DIRS)
                        + "); set templates_dir in the configuration")


def check_templates(config: Config) -> None:
    """Render every site's template once; TemplateError says which site's
    `template` field failed (`field` is its path, e.g. sites[1].template) and why."""
    where = config.templates_dir or "the slurm_templates directory"
    for i, site in enumerate(config.sites):
        try:
            for allocation in ("", *(a.name for a in site.allocations)):
                render_pilot_script(config, site, site.pilot.walltime_s, site.pilot.gpus,
                                    allocation=allocation)
        except jinja2.TemplateNotFound as exc:
            raise TemplateError(f"sites[{i}].template: no template {exc.name!r} in {where}",
                                field=f"sites[{i}].template") from exc
        except jinja2.TemplateError as exc:
            lineno = getattr(exc, "lineno", None)
            at = f"{site.template}:{lineno}" if lineno else site.template
            raise TemplateError(f"sites[{i}].template: {at} does not render: {exc}",
                                field=f"sites[{i}].template") from exc


@functools.lru_cache(maxsize=16)
def _environment(directory: Path) -> jinja2.Environment:
    """One environment per template directory, kept: it keeps each template compiled
    (compiling one takes ~20 ms, as long as the rest of a cycle's work per pilot) and
    compiles it again when its file changes (jinja2's auto_reload checks the mtime)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


#: Stands in for a token where a script is rendered only to be checked.
NO_TOKEN = "x.y.z"


def render_pilot_script(config: Config, site: SiteBase, walltime_s: int,
                        gpus: int = 0, start_slot: int = 0, start_slots: int = 1,
                        token: str = NO_TOKEN, allocation: str = "") -> str:
    """The batch script of one pilot at `site` that asks SLURM for `gpus` GPUs, the
    `start_slot`-th of `start_slots` submitted together (their starts are spread over
    `runtime.start_delay_max_s`, the first starts at once), carrying its `token` (the
    script goes to sbatch on its stdin, never into a file); jinja2 errors name the
    template. A pilot of `allocation` (one of the site's `allocations`; "": none) carries
    its name and groups: its startd advertises them and starts only jobs of those groups
    (provisioner.pilot.params). KeyError if the site has no allocation of that name."""
    if not TOKEN_TEXT.match(token):
        raise ValueError("a pilot token must be three base64url parts")
    groups = site.allocation(allocation).groups if allocation else ()
    rt = site.runtime
    env = _environment(templates_dir(config))
    template = env.get_template(site.template)
    return template.render(
        site=site.name,
        provisioner_id=config.pool.provisioner_id,
        collector=config.pool.collector,
        uid_domain=config.pool.uid_domain,
        image=site.image,
        pilot_token=token,
        pilot_condor_config=rt.condor_config,
        python=rt.python,
        walltime_s=walltime_s,
        shutdown_margin_s=site.pilot.shutdown_margin_s,
        noclaim_shutdown_s=rt.noclaim_shutdown_s,
        start_delay_max_s=rt.start_delay_max_s,
        start_slot=start_slot,
        start_slots=start_slots,
        scratch=rt.scratch,
        log_dir=rt.log_dir,
        # slurmrestd sites: the end record goes into the job's comment too.
        end_comment="1" if getattr(site, "backend", "") == "slurm-rest" else "0",
        bind=",".join(rt.bind),
        containers="1" if rt.containers else "0",
        container_test_image=rt.container_test_image or site.image,
        container_test_cache_s=rt.container_test_cache_s,
        payload_image=rt.payload_image,
        xcache=site.xcache or "",
        xcache_exclude=",".join(site.xcache_exclude),
        gpus=max(0, gpus),
        gpu_discovery_extra=rt.gpu_discovery_extra,
        gpu_driver=gpus > 0 and not rt.simulates_gpus,
        allocation=allocation,
        groups=",".join(groups),
    )
