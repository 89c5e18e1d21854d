"""Mutual TLS between services: a client without a valid certificate is refused, and a
whole `geoserve run` over mTLS completes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import grpc
import pytest
from geoserve.v1 import datacenter_pb2 as dpb
from geoserve.v1 import datacenter_pb2_grpc as dg

from services.deploy.tls import make_certs
from tests.procs import ROOT, service


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    good = tmp_path_factory.mktemp("tls")
    rogue = tmp_path_factory.mktemp("rogue")
    make_certs(good)
    make_certs(rogue)  # a certificate signed by another CA
    return good, rogue


def _env(d) -> dict[str, str]:
    return {"GEOSERVE_TLS_CERT": str(d / "cert.pem"), "GEOSERVE_TLS_KEY": str(d / "key.pem"),
            "GEOSERVE_TLS_CA": str(d / "ca.pem")}


def _creds(d) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=(d / "ca.pem").read_bytes(),
                                        private_key=(d / "key.pem").read_bytes(),
                                        certificate_chain=(d / "cert.pem").read_bytes())


async def _get_state(addr: str, creds: grpc.ChannelCredentials | None) -> None:
    ch = (grpc.aio.secure_channel(addr, creds) if creds is not None
          else grpc.aio.insecure_channel(addr))
    async with ch:
        await dg.DatacenterStub(ch).GetState(dpb.GetStateRequest(), timeout=3)


def test_clients_without_a_valid_certificate_are_refused(certs, monkeypatch):
    good, rogue = certs
    for k, v in _env(good).items():  # the service inherits it; the health wait uses it
        monkeypatch.setenv(k, v)
    with service("services.datacenter", "--dc", "tls-dc") as (_, addr):
        asyncio.run(_get_state(addr, _creds(good)))  # a certificate from the CA: served
        for creds in (None, _creds(rogue)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                asyncio.run(_get_state(addr, creds))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_run_over_mutual_tls_completes(certs, tmp_path):
    good, _ = certs
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "run", "--topology", "small", "--duration", "6",
         "--rate", "8", "--out", str(out), "--tls-cert", str(good / "cert.pem"),
         "--tls-key", str(good / "key.pem"), "--tls-ca", str(good / "ca.pem")],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rq = json.loads((out / "summary.json").read_text())["requests"]
    assert rq["emitted"] == rq["completed"] == 48
