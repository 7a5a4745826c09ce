"""Keeping credentials inside the process: URLs with credentials are refused where a run takes a URL, and
text that leaves the process (error lines, the run log) is scrubbed of URL credentials and of the values of
secret-looking environment variables.

Why refuse rather than redact: a spec is handed to Prefect as a flow-run parameter, and Prefect stores it in its
database (shown in its UI); the stage tasks receive the endpoint URL as a parameter too. A URL whose credentials
were moved aside would need a second channel to reach the tasks (Dask workers included); an API key already has
one (`model.api_key_env`, read in each process), and MLflow and PostgreSQL read theirs from the environment
(MLFLOW_TRACKING_USERNAME/PASSWORD, PGPASSWORD).
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

# scheme://user:password@host or scheme://token@host: everything between // and the first @ before a path
_USERINFO = re.compile(r"(?<=//)[^/?#@\s'\"]+@")
# environment variables whose values are credentials (OPENAI_API_KEY, PGPASSWORD, MLFLOW_TRACKING_TOKEN,
# PREFECT_API_AUTH_STRING, AWS_SECRET_ACCESS_KEY, ...)
SECRET_ENV = re.compile(r"(?i)(api[_-]?key|password|passwd|secret|token|credential|auth[_-]?string)")
MIN_SECRET_LEN = 6  # shorter values ("1", "true") would scrub ordinary words
# names of further variables holding credentials (a spec's model.api_key_env may be named anything), set by the
# CLI so that the processes it starts (Prefect's server, Dask workers) scrub them too
SECRET_ENV_NAMES = "RAGLEDGER_SECRET_ENV"


class CredentialsInURL(ValueError):
    """A URL given to ragledger carries credentials; the message shows it with them redacted."""


def redact_url(url: str | None) -> str | None:
    """scheme://user:password@host/... -> scheme://***@host/..."""
    if url is None:
        return None
    return _USERINFO.sub("***@", url)


def url_has_credentials(url: str | None) -> bool:
    if not url:
        return False
    try:
        parts = urlsplit(url)
    except ValueError:  # not parseable as a URL: look for the userinfo pattern itself
        return bool(_USERINFO.search(url))
    return parts.username is not None or parts.password is not None or bool(_USERINFO.search(url))


def refuse_credentials(url: str | None, where: str | None, instead: str) -> None:
    """Raise CredentialsInURL naming `where` (a spec field or option; None when the caller names it) and what to
    use `instead`. The URL is shown redacted."""
    if url_has_credentials(url):
        prefix = f"{where}: " if where else ""
        raise CredentialsInURL(f"{prefix}{redact_url(url)} carries credentials in the URL, which would be stored in "
                               f"clear (Prefect's flow-run parameters, run manifests); {instead}")


def secret_values(extra_env: tuple[str, ...] = ()) -> list[str]:
    """Values of the environment variables that hold credentials (by name, plus `extra_env`), longest first."""
    listed = (os.environ.get(SECRET_ENV_NAMES) or "").split(",")
    # a name ending in _ENV holds the name of another variable (model.api_key_env's style), not a credential
    named = {n for n in os.environ if SECRET_ENV.search(n) and not n.endswith("_ENV")}
    names = named | {n for n in (*extra_env, *listed) if n}
    values = {os.environ[n] for n in names if len(os.environ.get(n) or "") >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def mark_secret_env(name: str | None) -> None:
    """Scrub the value of environment variable `name` too, in this process and the ones it starts."""
    if not name:
        return
    listed = [n for n in (os.environ.get(SECRET_ENV_NAMES) or "").split(",") if n]
    if name not in listed:
        os.environ[SECRET_ENV_NAMES] = ",".join([*listed, name])


def scrub(text: str, extra_env: tuple[str, ...] = ()) -> str:
    """`text` without URL credentials or the values of secret environment variables (`***` in their place)."""
    text = redact_url(text) or ""
    for value in secret_values(extra_env):
        text = text.replace(value, "***")
    return text
