"""Who may reach a service ragledger starts: one rule for every starter (Prefect, MLflow, Dask); and whether its port
is free.

A service bound to the loopback interface is reachable only from this machine. Bound to any other address it is
reachable from the network, and then it must require credentials: Prefect's API an auth string, MLflow its
basic-auth app, Dask's scheduler TLS with client certificates. Starting one beyond loopback without them is
refused, naming what to set (docs/operations.md, "Across machines").
"""

from __future__ import annotations

import base64
import ipaddress


class ExposureError(ValueError):
    """A service would be reachable from the network without credentials."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it resolves to whatever the network says, so it counts as exposed
        return False


def require_credentials(service: str, host: str, present: bool, what: str) -> None:
    """Raise ExposureError when `service` would bind `host` (not loopback) without credentials (`present` False);
    `what` says what to set."""
    if not present and not is_loopback(host):
        raise ExposureError(f"{service} on {host} would accept anyone on the network: set {what} "
                            "(or bind 127.0.0.1)")


def local_address(host: str) -> str:
    """The address a client on this machine uses for a service bound to `host` (a wildcard bind answers on
    loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "[::]", "") else host


def port_in_use(host: str, port: int) -> bool:
    """Whether another process listens on host:port, asked before a service is started there: the services say so
    only in their logs, and MLflow's server and UI then exit 0."""
    import errno
    import socket

    address = host.strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: a port in TIME_WAIT is free
        try:
            probe.bind((address, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE  # another failure (an address not of this machine) is the service's to tell
    return False


def basic_auth_header(user_and_password: str) -> str:
    """The HTTP Authorization header value for `user:password`, as Prefect's and MLflow's clients send it."""
    return "Basic " + base64.b64encode(user_and_password.encode()).decode()
