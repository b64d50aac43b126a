"""The UI's form for ``retrain`` keeps its fields in their declared order on any database.

PostgreSQL keeps Prefect's parameter schema as JSONB, which reorders keys (shorter first); Prefect's UI orders a
form's fields by ``position``, which it sets for a flow's own parameters but not for a model's fields.
"""

from __future__ import annotations

import json

from prefect.utilities.callables import parameter_schema

from flows.retrain import RetrainParams, retrain


def test_every_field_of_the_form_carries_its_declared_position() -> None:
    schema = parameter_schema(retrain.fn).model_dump()
    props = (schema.get("definitions") or schema["$defs"])["RetrainParams"]["properties"]
    assert {name: p["position"] for name, p in props.items()} == {
        name: i for i, name in enumerate(RetrainParams.model_fields)}
    # what a JSONB round trip does to the keys, and what the UI's sort by position gives back
    jsonb = dict(sorted(props.items(), key=lambda kv: (len(kv[0]), kv[0])))
    assert list(jsonb) != list(RetrainParams.model_fields)
    shown = sorted(json.loads(json.dumps(jsonb)).items(), key=lambda kv: kv[1]["position"])
    assert [name for name, _ in shown][:3] == ["training", "dataset", "job_id"]
