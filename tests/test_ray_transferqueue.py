"""The transferqueue transport when it cannot run: an exact reason and the install line, nothing started.

The run itself (when TransferQueue is installed) is in ``test_ray.py``, on the shared cluster.
"""

from __future__ import annotations

import pytest

import picklescope as ps
from picklescope.ray.transferqueue import INSTALL_HINT
from picklescope.ray.transport import TransferQueueTransport, TransportUnavailable

TQ = TransferQueueTransport()


def test_listed_with_its_state():
    from picklescope.transports import TRANSPORTS

    assert {"ray", "ray-arg", "transferqueue"} <= set(TRANSPORTS)
    assert ("unavailable" in TQ.summary) == (TQ.availability() is not None)


def test_unavailable_transferqueue_refuses_with_the_reason_and_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PICKLESCOPE_TQ_DIR", str(tmp_path / "no-transferqueue-here"))
    reason = TQ.availability()
    assert reason and "transfer_queue" in reason and "no-transferqueue-here" in reason
    with pytest.raises(TransportUnavailable) as err:
        ps.run("numpy", "transferqueue", "tiny", 1.0)
    assert reason in str(err.value) and err.value.hint == INSTALL_HINT and "--no-deps" in INSTALL_HINT


def test_ray_address_reaches_the_run_as_a_transport_option():
    from picklescope.cli import build_parser
    from picklescope.cli.commands.common import run_kwargs

    args = build_parser().parse_args(["run", "--transport", "ray", "--ray-address", "10.0.0.5:6379"])
    assert run_kwargs(args)["transport_options"] == {"ray_address": "10.0.0.5:6379"}
    assert "transport_options" not in run_kwargs(build_parser().parse_args(["run"]))
