"""Export the documents' JSON Schema for editors and GitOps repositories.

``python -m stortune.schemas.export [DIR]`` writes one file per document kind;
a test fails when the committed files are stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from stortune.schemas.bench.spec import BenchmarkSpec
from stortune.schemas.profile import StorageProfile
from stortune.schemas.rollout.spec import RolloutSpec
from stortune.schemas.tuning.experiment import TuningExperiment

DOCUMENTS: dict[str, type[BaseModel]] = {
    "storageprofile.schema.json": StorageProfile,
    "benchmarkspec.schema.json": BenchmarkSpec,
    "tuningexperiment.schema.json": TuningExperiment,
    # spec.rollout of a StorageProfile (also inside storageprofile.schema.json), on its own for
    # editors and tools that check the rollout alone (docs/rollouts.md).
    "rollout.schema.json": RolloutSpec,
}


def render() -> dict[str, str]:
    out = {}
    for filename, model in DOCUMENTS.items():
        schema = model.model_json_schema(by_alias=True, mode="validation")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://stortune.dev/schemas/v1/{filename}"
        out[filename] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "jsonschema"
    target.mkdir(parents=True, exist_ok=True)
    for filename, text in render().items():
        (target / filename).write_text(text)
        print(target / filename)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
