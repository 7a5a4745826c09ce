"""A long-lived Dask scheduler and workers for `ragledger run --scheduler`, with mutual TLS (`infra/dask_cluster.sh`).

    python -m ragledger.dask_cluster certs                         # a CA, and a key and certificate per role
    python -m ragledger.dask_cluster start [--host H] [--port P] [--workers N]
    python -m ragledger.dask_cluster stop|status

TLS is Dask's own (`distributed.Security`): the scheduler, every worker and every client present a certificate signed
by the cluster's CA and require one from the other side, so a client without one is refused at the handshake. The
scheduler uses it whenever the certificates exist, and must beyond 127.0.0.1 (core/exposure.py). ragledger's client
takes its certificate from Dask's own configuration (`DASK_DISTRIBUTED__COMM__TLS__*`, printed by `certs`). Each worker
gets its own working directory and HOME under the cluster's folder, as a worker on another host would have.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from core.exposure import ExposureError, local_address, port_in_use, require_credentials
from core.processes import pid_alive, stop_process_group

ROLES = ("scheduler", "worker", "client")
CERT_DAYS = 365


class DaskClusterError(RuntimeError):
    pass


def cluster_dir() -> Path:
    return Path(os.environ.get("RAGLEDGER_DASK_DIR", ".ragledger/dask")).resolve()


def tls_dir() -> Path:
    return Path(os.environ.get("RAGLEDGER_DASK_TLS_DIR", cluster_dir() / "tls")).resolve()


def _files(role: str, directory: Path) -> tuple[Path, Path]:
    return directory / f"{role}.pem", directory / f"{role}-key.pem"


def has_certificates(directory: Path) -> bool:
    return (directory / "ca.pem").is_file() and all(p.is_file() for r in ROLES for p in _files(r, directory))


def client_config(directory: Path) -> dict[str, str]:
    """The environment that makes a Dask client (ragledger's included) present the client certificate."""
    cert, key = _files("client", directory)
    return {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(directory / "ca.pem"),
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(cert),
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(key),
            "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}


def make_certificates(directory: Path) -> None:
    """A new CA and, signed by it, a key and certificate for the scheduler, the workers and the clients. Keys are
    readable by their owner only; hand a host the CA certificate and its role's pair, never the CA's key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ragledger"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
        path.touch(mode=0o600)
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("ragledger dask CA")).issuer_name(name("ragledger dask CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    write_key(directory / "ca-key.pem", ca_key)
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for role in ROLES:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(f"ragledger dask {role}")).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256()))
        cert_path, key_path = _files(role, directory)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_key(key_path, key)


def _tls_args(role: str, directory: Path) -> list[str]:
    cert, key = _files(role, directory)
    return ["--tls-ca-file", str(directory / "ca.pem"), "--tls-cert", str(cert), "--tls-key", str(key)]


def _state() -> dict | None:
    try:
        return json.loads((cluster_dir() / "cluster.json").read_text())
    except (OSError, ValueError):
        return None


def status() -> str | None:
    state = _state()
    return state["address"] if state and pid_alive(int(state["scheduler_pid"])) else None


# where a process keeps what belongs to its machine (models, indexes, store mirrors, the call cache, Prefect's
# database and results): a worker takes none of the starter's, but its own under its HOME, as on another host
MACHINE_PLACES = ("RAGLEDGER_HOME", "RAGLEDGER_INDEX_DIR", "PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH")


def start(host: str = "127.0.0.1", port: int = 8786, workers: int = 2, threads: int = 4,
          timeout_s: float = 120.0) -> tuple[str, bool]:
    """Start a scheduler on host:port and `workers` worker processes, each in its own folder and HOME (idempotent).
    Returns (address, started_now)."""
    if workers < 1:
        raise DaskClusterError(f"workers: {workers} (RAGLEDGER_DASK_WORKERS or --workers) must be at least 1")
    certs = tls_dir()
    tls = has_certificates(certs)
    require_credentials("the Dask scheduler", host, tls,
                        f"TLS certificates in {certs} (make them with `bash infra/dask_cluster.sh certs`)")
    address = status()
    if address:
        return address, False
    if port_in_use(host, port):  # its workers would join whatever listens there
        raise DaskClusterError(f"{host}:{port} is in use by another process; choose another port "
                               "(RAGLEDGER_DASK_PORT or --port)")
    base = cluster_dir()
    base.mkdir(parents=True, exist_ok=True)
    address = f"{'tls' if tls else 'tcp'}://{local_address(host)}:{port}"
    dask = str(Path(sys.executable).parent / "dask")  # the `dask` CLI of this environment
    scheduler_args = [dask, "scheduler", "--host", host, "--port", str(port), "--no-dashboard",
                      *(["--protocol", "tls", *_tls_args("scheduler", certs)] if tls else [])]
    log = base / "scheduler.log"
    with open(log, "ab") as out:
        scheduler = subprocess.Popen(scheduler_args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
    pids = []
    for i in range(workers):
        home = base / f"worker-{i}"
        (home / "home").mkdir(parents=True, exist_ok=True)
        env = {**{k: v for k, v in os.environ.items() if k not in MACHINE_PLACES}, "HOME": str(home / "home")}
        with open(home / "worker.log", "ab") as out:
            worker = subprocess.Popen(
                [dask, "worker", address, "--nworkers", "1",
                 "--nthreads", str(threads), "--name", f"worker-{i}", "--local-directory", str(home),
                 "--no-dashboard", *(_tls_args("worker", certs) if tls else [])],
                cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        pids.append(worker.pid)
    (base / "cluster.json").write_text(json.dumps({"address": address, "scheduler_pid": scheduler.pid,
                                                   "worker_pids": pids, "tls": tls}))
    _wait_for_workers(address, workers, scheduler, log, certs if tls else None, timeout_s)
    return address, True


def _wait_for_workers(address: str, workers: int, scheduler: subprocess.Popen, log: Path, certs: Path | None,
                      timeout_s: float) -> None:
    from distributed import Client
    from distributed.security import Security

    security = Security(**_security_kwargs(certs)) if certs else None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if scheduler.poll() is not None:
            raise DaskClusterError(f"the Dask scheduler exited with code {scheduler.returncode}; see {log}")
        try:
            with Client(address, timeout=5, security=security) as client:
                client.wait_for_workers(workers, timeout=max(1.0, deadline - time.monotonic()))
                return
        except (OSError, TimeoutError):
            time.sleep(0.5)
    stop()
    raise DaskClusterError(f"the Dask cluster at {address} did not have {workers} worker(s) within {timeout_s:.0f} s; "
                           f"see the logs under {cluster_dir()}")


def _security_kwargs(certs: Path) -> dict:
    cert, key = _files("client", certs)
    return {"tls_ca_file": str(certs / "ca.pem"), "tls_client_cert": str(cert), "tls_client_key": str(key),
            "require_encryption": True}


def stop() -> bool:
    state = _state()
    if state is None:
        return False
    for pid in [*state.get("worker_pids", []), state.get("scheduler_pid", 0)]:
        if pid and pid_alive(int(pid)):
            stop_process_group(int(pid), grace_s=10)
    (cluster_dir() / "cluster.json").unlink(missing_ok=True)
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="infra/dask_cluster.sh")
    parser.add_argument("command", choices=["certs", "start", "stop", "status"])
    parser.add_argument("--host", default=os.environ.get("RAGLEDGER_DASK_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("RAGLEDGER_DASK_PORT", "8786")))
    parser.add_argument("--workers", type=int, default=int(os.environ.get("RAGLEDGER_DASK_WORKERS", "2")))
    args = parser.parse_args(argv)
    try:
        if args.command == "certs":
            make_certificates(tls_dir())
            print(f"certificates in {tls_dir()}; a client (ragledger run --scheduler tls://...) needs:")
            for name, value in client_config(tls_dir()).items():
                print(f"export {name}={value}")
        elif args.command == "start":
            address, started = start(args.host, args.port, args.workers)
            print(f"Dask cluster {'started' if started else 'already running'}: {address} "
                  f"(use it with ragledger run SPEC --scheduler {address})")
        elif args.command == "stop":
            print("Dask cluster stopped" if stop() else "no Dask cluster was running")
        else:
            address = status()
            print(f"Dask cluster: {address}" if address else "Dask cluster: not running")
            return 0 if address else 1
    except (DaskClusterError, ExposureError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
