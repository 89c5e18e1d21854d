"""``geoserve tls-certs``: a private CA and one certificate for every GeoServe service.

The certificate is valid for server and client use (mutual TLS), for ``localhost``,
``127.0.0.1`` and every host name given (the compose service names of a topology with
``--topology``). Made with the ``openssl`` command line; the files are written to
``--out``: ``ca.pem``, ``cert.pem``, ``key.pem`` (point ``GEOSERVE_TLS_CA/CERT/KEY`` or
``--tls-ca/--tls-cert/--tls-key`` at them).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from services.model.errors import InvalidInput


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise InvalidInput("openssl", "the openssl command is needed to make certificates")
    proc = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InvalidInput("openssl", f"{' '.join(args[:2])} failed: {proc.stderr.strip()}")


def make_certs(out: Path, hosts: Sequence[str] = (), days: int = 30) -> list[Path]:
    """Write ca.pem, cert.pem and key.pem under `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    names = ["localhost", *dict.fromkeys(h for h in hosts if h and h != "localhost")]
    san = ",".join([*(f"DNS:{n}" for n in names), "IP:127.0.0.1", "IP:::1"])
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "ext.cnf").write_text(
            "basicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            f"subjectAltName={san}\n")
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                 "-out", "ca.pem", "-days", str(days), "-subj", "/CN=GeoServe test CA",
                 cwd=t)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out",
                 "cert.csr", "-subj", "/CN=geoserve", cwd=t)
        _openssl("x509", "-req", "-in", "cert.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "cert.pem", "-days", str(days), "-extfile",
                 "ext.cnf", cwd=t)
        written = []
        for name in ("ca.pem", "cert.pem", "key.pem"):
            dst = out / name
            shutil.copyfile(t / name, dst)
            written.append(dst)
    (out / "key.pem").chmod(0o600)
    return written
