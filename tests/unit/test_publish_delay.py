from __future__ import annotations

import pytest

from insitu.federated.publish_delay import publish_delay


def test_a_site_waits_only_for_the_jobs_its_operator_named() -> None:
    assert publish_delay(None, "job-1") == 0.0
    assert publish_delay('{"job-1": 2.5}', "job-1") == 2.5
    assert publish_delay('{"job-1": 2.5}', "job-2") == 0.0


@pytest.mark.parametrize("text", ['["job-1"]', '{"job-1": -1}', '{"job-1": "8"}', '{"job-1": true}',
                                  '{"job-1": 1e9}', "{not json"])
def test_a_malformed_file_is_said_not_ignored(text: str) -> None:
    with pytest.raises(ValueError, match="publish-delay.json"):
        publish_delay(text, "job-1")


def test_a_site_can_be_slowed_in_named_rounds_only() -> None:
    text = '{"job-1": {"2": 12}}'
    assert [publish_delay(text, "job-1", r) for r in range(4)] == [0.0, 0.0, 12.0, 0.0]
    with pytest.raises(ValueError, match="publish-delay.json"):
        publish_delay('{"job-1": {"2": -3}}', "job-1", 2)
