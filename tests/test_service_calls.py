"""The daemon's service refuses a call that cannot fit with a fix the caller
can apply: a shorter call, or (when the agent's prefix alone leaves no room)
a larger budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from topasd.config import load_settings
from topasd.daemon.calls import CallSpec
from topasd.daemon.errors import Invalid
from topasd.daemon.service import Service


def test_a_call_that_cannot_fit_names_a_fix_the_caller_can_apply(tmp_path: Path) -> None:
    settings = load_settings({"budget": 3000, "speed": 20.0, "db": str(tmp_path / "s.db")},
                             environ={}).settings
    svc = Service(settings)
    svc.start()
    try:
        long = CallSpec(system_tokens=0, system_key="", input_tokens=1, output_tokens=5000,
                        agent="solo")
        with pytest.raises(Invalid, match="lower max_tokens or shorten the prompt"):
            svc.submit_call(long).result(10)
        chain3 = CallSpec(system_tokens=0, system_key="", input_tokens=1, output_tokens=8,
                          task_key="t", workflow="chain3", stage="a")
        with pytest.raises(Invalid) as refused:
            svc.submit_call(chain3).result(10)
        message = str(refused.value)
        assert "prefix 4000" in message and "lower max_tokens" not in message
        assert "the prefix of agent 'A' alone does not leave room: give the daemon a larger " \
               "--budget, or a spec of 'chain3' with a shorter prefix" in message
    finally:
        svc.drain(0.0)
        svc.wait_stopped(30)
        svc.close()
