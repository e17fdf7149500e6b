"""Render a site's pilot batch script from its Jinja2 template (slurm_templates/).

Values come from the validated configuration; every one that lands in shell
context goes through the `q` filter (shlex.quote). Per-submission sbatch
options (cores, memory, time, name, comment, signal) are not part of the
script: the backend passes them as argv.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import jinja2

from provisioner.config import Config, SiteConfig

#: slurm_templates/ of this project (a source checkout or the installed share dir).
DEFAULT_TEMPLATES = Path(__file__).resolve().parents[2] / "slurm_templates"


def templates_dir(config: Config) -> Path:
    return Path(config.templates_dir) if config.templates_dir else DEFAULT_TEMPLATES


def _environment(directory: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


def render_pilot_script(config: Config, site: SiteConfig, walltime_s: int) -> str:
    """The batch script of one pilot at `site`; jinja2 errors name the template."""
    rt = site.runtime
    env = _environment(templates_dir(config))
    template = env.get_template(site.template)
    return template.render(
        site=site.name,
        provisioner_id=config.pool.provisioner_id,
        collector=config.pool.collector,
        uid_domain=config.pool.uid_domain,
        image=site.image,
        pilot_token_file=rt.token_file,
        pilot_condor_config=rt.condor_config,
        python=rt.python,
        walltime_s=walltime_s,
        shutdown_margin_s=site.pilot.shutdown_margin_s,
        noclaim_shutdown_s=rt.noclaim_shutdown_s,
        start_delay_max_s=rt.start_delay_max_s,
        scratch=rt.scratch,
        log_dir=rt.log_dir,
        xcache=site.xcache or "",
    )
