"""``valid`` is in every batch that remote workers make too (see test_valid_mask.py for local ones): the scenario
runs in tests/ray_scenarios.py's Ray session (tests/valid_remote_scenario.py), whose report test_remote.py makes."""
import pytest

from test_remote import scenarios_report

pytest.importorskip("ray", reason="Ray is not installed (pip install 'feedline[ray]')")


def test_remote_batches_carry_valid(tmp_path_factory):
    report = scenarios_report(tmp_path_factory)["valid"]
    images, rows = report["images"], report["criteo"]
    assert images["remote_batches"] > 0 and rows["remote_batches"] > 0  # made by the Ray worker, not only locally
    assert images["checks"] and all(images["checks"]) and rows["checks"] and all(rows["checks"])
    assert sorted(images["delivered"]) == [i for i in range(10) if i != report["not_an_image"]]
    assert sorted(rows["delivered"]) == list(range(300))
