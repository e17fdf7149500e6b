"""`site check` of a site reached through slurmrestd: its token file, the server (is
it slurmrestd, which API version both speak), the token accepted; each failing row
names the field to fix. The image cannot be looked at without a login: the probe
pilot checks it on a worker.
"""

from __future__ import annotations

import time

from provisioner.config import RestSiteConfig
from provisioner.errors import BackendError
from provisioner.onboard.table import Check, failed, passed, skipped
from provisioner.sites.rest_client import SPOKEN_VERSIONS, RestClient

R = "rest"


def rest_checks(index: int, site: RestSiteConfig, client: RestClient) -> list[Check]:
    """Token file, server and version, token accepted: rows, in order; a failed row
    ends them (the rest cannot be asked)."""
    f = f"sites[{index}].rest"
    rows: list[Check] = []
    try:
        client.token.token()
        exp = client.token.expires_at()
        until = (time.strftime("valid until %Y-%m-%d %H:%M UTC", time.gmtime(exp))
                 if exp is not None else "no expiry")
        rows.append(passed("JWT token file", f"{site.rest.token_file} (private, {until})", R))
    except BackendError as exc:
        fix = (f"a fresh token for {site.rest.user} into {f}.token_file (at the site: "
               f"scontrol token username={site.rest.user} lifespan=S), or set "
               f"{f}.renew_command" if "expired" in str(exc) else
               f"fix {f}.token_file as said (mode 600, owned by the service's account)")
        return [failed("JWT token file", str(exc), fix, R)]
    t0 = time.monotonic()
    try:
        version = client.version()
    except BackendError as exc:
        if "refused the token" in str(exc):
            return [*rows, failed("token accepted", str(exc), f"the site refused "
                                  f"{f}.token_file for {f}.user {site.rest.user}: expired, "
                                  f"revoked or another user's; mint a fresh one", R)]
        return [*rows, failed("slurmrestd answers", str(exc),
                              f"check {f}.url (slurmrestd's address; API versions this "
                              f"provisioner speaks: {', '.join(SPOKEN_VERSIONS)}; or pin "
                              f"{f}.api_version)", R)]
    rows.append(passed("slurmrestd answers", f"{site.rest.url}: API {version} (the newest "
                       "both speak)", R, time.monotonic() - t0))
    try:  # a request the controller itself authenticates
        reply = client.call("GET", "partitions")
    except BackendError as exc:
        return [*rows, failed("token accepted", str(exc), f"mint a fresh token for "
                              f"{site.rest.user} into {f}.token_file", R)]
    if reply.text or reply.status != 200:
        return [*rows, failed("token accepted", f"GET partitions: {reply.text or reply.status}",
                              "see SLURM's words; is the controller up?", R)]
    rows.append(passed("token accepted", f"as {site.rest.user}; the controller answers", R))
    return rows


def image_row(site: RestSiteConfig) -> Check:
    return skipped("image on the login node", f"no login at a slurm-rest site: the probe "
                   f"checks {site.image} on a worker", "image")
