"""Base-60 numbers (YAML 1.1's ``1:30:00``) are bounded in parts, in both document loaders.

PyYAML builds a base-60 integer in time quadratic in its parts (a 1 MiB body of four
of them held a parser thread 13 s) and a base-60 float of some 200 parts raises
OverflowError, which no caller takes for bad YAML (a 500 from the API).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from stortune.schemas import yamlsafe
from stortune.schemas.documents import DocumentError, load_yaml_documents

LOADERS: dict[str, Callable[[str], list[Any]]] = {
    "walked (the server's)": lambda text: yamlsafe.load_all_walked(text.encode()),
    "bounded (files and the CLI)": yamlsafe.load_all,
}


def _base60(parts: int, fraction: str = "") -> str:
    return ":".join(["1"] * parts) + fraction


@pytest.mark.parametrize("load", LOADERS.values(), ids=LOADERS.keys())
@pytest.mark.parametrize("fraction", ["", ".5"], ids=["int", "float"])
def test_hostile_base60_number_past_the_parts_bound_is_bad_yaml(
        load: Callable[[str], list[Any]], fraction: str) -> None:
    refusal = rf"base-60 number .* more than {yamlsafe.MAX_BASE60_PARTS} parts"
    for parts in (yamlsafe.MAX_BASE60_PARTS + 1, 200, 100_000):
        with pytest.raises(yaml.YAMLError, match=refusal):
            load(f"a: {_base60(parts, fraction)}\n")


@pytest.mark.parametrize("load", LOADERS.values(), ids=LOADERS.keys())
def test_base60_numbers_within_the_bound_keep_their_value(load: Callable[[str], list[Any]]) -> None:
    parts = yamlsafe.MAX_BASE60_PARTS
    assert load(f"a: {_base60(parts)}\nb: 1:30:00.5\nc: 1:30\n") == [
        {"a": sum(60 ** i for i in range(parts)), "b": 5400.5, "c": 90}]
    quoted = f'"{_base60(200)}"'
    assert load(f"a: {quoted}\n") == [{"a": _base60(200)}]


def test_hostile_base60_float_in_a_file_is_a_document_error() -> None:
    with pytest.raises(DocumentError, match=r"not valid YAML: .*base-60"):
        load_yaml_documents(f"spec: {{priority: {_base60(200, '.5')}}}\n", "p.yaml")
