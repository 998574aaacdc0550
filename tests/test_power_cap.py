"""A deliberate power cap (`gpubox_expected_power_limit`, watts per box) is ok; a drift from it is a
finding with its own cause and repair; the inventory value is checked like every other number."""

import json
from pathlib import Path

import pytest

from gpubox.errors import InventoryError
from gpubox.hwtune.probe_verdict import decide, limits
from gpubox.invschema import check_host

DOC = Path(__file__).parent / "fixtures" / "probe" / "h200_real.json"


def _state(cap, default, expected=None):
    doc = json.loads(DOC.read_text())
    doc["nvml"]["gpus"][0].update(power_limit_w=cap, power_default_w=default)
    lim = limits()
    if expected is not None:
        lim["expected_power_w"] = expected
    (c,) = [c for c in decide(doc, lim, expect_gpus=1) if c.name.endswith(" state")]
    return c


@pytest.mark.parametrize(
    "cap, default, expected, status, words",
    [
        (230.0, 388.0, 230.0, "ok", ["power cap 230 W as set (gpubox_expected_power_limit)"]),
        (230.4, 388.0, 230.0, "ok", ["as set"]),  # NVML's milliwatts, not a drift
        (388.0, 388.0, 230.0, "drift", ["expected cap is 230 W", "deliberate cap is gone", "-pl 230"]),
        (200.0, 388.0, 230.0, "drift", ["below the box's deliberate cap", "-pl 230"]),
        (230.0, 388.0, None, "drift", ["below the GPU's default 388 W", "gpubox_expected_power_limit: 230"]),
        (700.0, 700.0, None, "ok", ["persistence"]),
    ],
)
def test_power_cap_against_the_expected_cap(cap, default, expected, status, words):
    c = _state(cap, default, expected)
    assert c.status == status, c.detail
    text = " ".join(filter(None, [c.detail, c.cause, c.repair]))
    for w in words:
        assert w in text, (w, text)


@pytest.mark.parametrize("value", [250, 250.5, 1000])
def test_the_inventory_takes_watts(value):
    check_host("ct200", {"gpubox_expected_power_limit": value})


@pytest.mark.parametrize("value", ["250W", "250", 0, -5, True, float("nan"), float("inf"), 1e9, [250]])
def test_the_inventory_refuses_what_is_not_watts(value):
    with pytest.raises(InventoryError) as ei:
        check_host("ct200", {"gpubox_expected_power_limit": value})
    assert "ct200: gpubox_expected_power_limit = " in str(ei.value) and "watts" in str(ei.value)
