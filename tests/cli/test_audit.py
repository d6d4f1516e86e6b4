"""`stortune audit` against the real control plane: the audit log as a table or a document, filtered
as GET /api/v1/audit filters it, and only for admins."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import ControlPlane, Run, profile_yaml

HEADERS = ["TIME", "TOKEN", "ROLE", "METHOD", "RESOURCE", "CODE", "CLIENT", "PATH"]


@pytest.fixture
def history(stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> dict[str, str]:
    """Audited calls by three tokens: an apply, a label change, a refused write, a failed delete.
    Returns the token ids by name."""
    control_plane.register("web-1", {"role": "streamer"})
    operator = control_plane.issue("operator", name="alice")
    viewer = control_plane.issue("viewer", name="bob")
    doc = tmp_path / "vod.yaml"
    doc.write_text(profile_yaml("vod"))
    assert stortune("apply", "-f", str(doc), token=operator).code == 0
    assert stortune("label", "host", "web-1", "tier=gold", token=operator).code == 0
    other = tmp_path / "live.yaml"
    other.write_text(profile_yaml("live"))
    assert stortune("apply", "-f", str(other), token=viewer).code == 1  # 403, audited too
    with control_plane.http(operator) as http:
        assert http.delete("/profiles/missing").status_code == 404
    with control_plane.http() as http:
        return {t["name"]: t["id"] for t in http.get("/tokens").json()["items"]}


def records(stortune: Run, *args: str) -> list[dict[str, object]]:
    done = stortune("audit", *args, "-o", "json")
    assert done.code == 0, done.err
    items: list[dict[str, object]] = json.loads(done.out)["items"]
    return items


def test_the_table_shows_who_did_what_newest_first(stortune: Run, history: dict[str, str]) -> None:
    done = stortune("audit")
    assert done.code == 0, done.err
    header, *lines = done.out.splitlines()
    assert header.split() == HEADERS
    cells = [line.split() for line in lines]
    # newest first: the failed delete, the refused apply, the label, the apply's question for the
    # errors of the hosts it selects, the apply (then the registration)
    assert [c[4:8] for c in cells[:5]] == [["operator", "DELETE", "profiles/missing", "404"],
                                           ["viewer", "POST", "profiles", "403"],
                                           ["operator", "PATCH", "hosts/web-1/labels", "200"],
                                           ["operator", "POST", "plans", "200"],
                                           ["operator", "POST", "profiles/vod", "201"]]
    assert cells[0][2:4] == ["alice", f"({history['alice']})"]
    assert cells[0][0].count("-") == 2 and cells[0][1].endswith("Z")  # an absolute UTC time
    assert "127.0.0.1" in lines[0] and "/api/v1/profiles/missing" in lines[0]


def test_filters_are_the_apis(stortune: Run, history: dict[str, str]) -> None:
    by_bob = records(stortune, "--token-id", history["bob"])
    assert [(r["tokenName"], r["code"]) for r in by_bob] == [("bob", 403)]
    deletes = records(stortune, "--method", "delete")  # any case: sent as DELETE
    assert [r["resource"] for r in deletes] == ["profiles/missing"]
    vod = records(stortune, "--resource", "profiles/vod")
    assert [(r["method"], r["code"]) for r in vod] == [("POST", 201)]
    assert len(records(stortune, "--limit", "2")) == 2
    assert records(stortune, "--since", (datetime.now(UTC) + timedelta(hours=1)).isoformat()) == []
    recent = records(stortune, "--since", (datetime.now(UTC) - timedelta(hours=1)).isoformat())
    assert len(recent) >= 4
    as_yaml = yaml.safe_load(stortune("audit", "--method", "PATCH", "-o", "yaml").out)
    assert as_yaml["kind"] == "AuditRecordList" and as_yaml["items"][0]["resource"] == "hosts/web-1/labels"
    none = stortune("audit", "--resource", "profiles/never-touched")
    assert none.code == 0 and none.out == "" and none.err.strip() == "No audit records found."


def test_hostile_filters_and_tokens_are_refused_by_name(stortune: Run, history: dict[str, str],
                                                         control_plane: ControlPlane) -> None:
    """Refused with exit 1 and the reason: a bad value the server names, a bad value argparse names,
    and any token but an admin's."""
    for args, words in [
        (["--since", "yesterday"], "since"),
        (["--since", "2025-13-45T99:00:00Z"], "since"),
        (["--token-id", "../../tokens"], "token"),
        (["--resource", "profiles/\x00"], "resource"),
    ]:
        refused = stortune("audit", *args)
        assert refused.code == 1, (args, refused.out)
        assert words in refused.err, (args, refused.err)
        assert refused.out == ""
    for args in (["--method", "TRACE"], ["--limit", "0"], ["--limit", "1001"], ["--limit", "x"]):
        bad = stortune("audit", *args)
        assert bad.code == 1 and "usage:" in bad.err, args
    operator = stortune("audit", token=control_plane.issue("operator", name="carol"))
    assert operator.code == 1 and "forbidden" in operator.err and operator.out == ""
    anonymous = stortune("audit", token=None)
    assert anonymous.code == 1 and "not authenticated" in anonymous.err
