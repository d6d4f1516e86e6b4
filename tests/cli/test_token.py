"""`stortune token` and how the CLI authenticates: --token, --token-file, $STORTUNE_TOKEN; 401/403."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import pytest

from stortune.cli.client import Client
from tests.cli.conftest import ControlPlane, Run, profile_yaml


def test_create_list_use_and_revoke_a_support_token(stortune: Run, control_plane: ControlPlane) -> None:
    control_plane.register("web-1", {"role": "streamer"})
    control_plane.register("db-1", {"role": "db"})
    made = stortune("token", "create", "--role", "support", "--name", "vendor-1234",
                    "--hosts", "role=streamer", "--expires", "72h")
    assert made.code == 0, made.err
    secret = made.out.strip()
    assert secret.startswith("stt_") and made.out == secret + "\n"  # stdout: the secret alone
    assert "vendor-1234, role support, expires " in made.err and secret not in made.err

    assert stortune("get", "hosts", "-o", "name", token=secret).out == "host/web-1\n"
    outside = stortune("describe", "host", "db-1", token=secret)
    assert outside.code == 1 and 'Host "db-1" not found' in outside.err

    listed = stortune("token", "list")
    assert listed.code == 0 and "vendor-1234" in listed.out and "role=streamer" in listed.out
    assert secret not in listed.out
    items = json.loads(stortune("token", "list", "-o", "json").out)["items"]
    token_id = next(t["id"] for t in items if t["name"] == "vendor-1234")
    assert all("token" not in t for t in items)

    revoked = stortune("token", "revoke", token_id)
    assert revoked.code == 0 and f"token/{token_id} (vendor-1234) revoked" in revoked.out
    refused = stortune("get", "hosts", token=secret)
    assert refused.code == 1
    assert "not authenticated: the token was revoked" in refused.err and "--token-file" in refused.err


def test_bad_requests_are_named(stortune: Run) -> None:
    result = stortune("token", "create", "--role", "support", "--expires", "72h")
    assert result.code == 1 and "hostSelector" in result.err and "must name the hosts" in result.err


def test_no_token_and_a_role_that_may_not(stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> None:
    anonymous = stortune("get", "profiles", token=None)
    assert anonymous.code == 1 and "not authenticated: this call needs a token" in anonymous.err
    assert "STATE_DIR/admin.token" in anonymous.err

    viewer = control_plane.issue("viewer", name="dashboards")
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml("vod") + "---\n" + profile_yaml("live"))
    refused = stortune("apply", "-f", str(path), token=viewer)
    assert refused.code == 1
    assert "forbidden: token" in refused.err and "role viewer) may not write profiles" in refused.err
    assert refused.err.count("forbidden") == 1  # said once, not once per document
    assert stortune("get", "profiles", token=viewer).code == 0


def test_token_file_and_environment(stortune: Run, control_plane: ControlPlane, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    viewer = control_plane.issue("viewer")
    file = tmp_path / "token"
    file.write_text(viewer + "\n")
    assert stortune("get", "profiles", "--token-file", str(file), token=None).code == 0
    monkeypatch.setenv("STORTUNE_TOKEN", viewer)
    assert stortune("get", "profiles", token=None).code == 0
    # --token-file beats the environment, and a file that is not there is a clear error
    missing = stortune("get", "profiles", "--token-file", str(tmp_path / "nope"), token=None)
    assert missing.code == 1 and f"--token-file {tmp_path / 'nope'}: No such file" in missing.err
    monkeypatch.setenv("STORTUNE_TOKEN", "stt_" + "z" * 43)
    assert stortune("get", "profiles", token=None).code == 1


def test_rate_limited_calls_are_retried_after_retry_after() -> None:
    answers = [(429, {"Retry-After": "2"}), (429, {"Retry-After": "3"}), (200, {})]
    seen: list[str | None] = []
    slept: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        code, headers = answers.pop(0)
        body = {"items": []} if code == 200 else {"kind": "Status", "code": 429, "message": "slow down"}
        return httpx.Response(code, json=body, headers=headers)

    secret = "stt_" + secrets.token_urlsafe(8)
    with Client("http://cp.test", token=secret, transport=httpx.MockTransport(handle),
                sleep=slept.append) as client:
        assert client.list_profiles().items == []
    assert slept == [2.0, 3.0] and seen == [f"Bearer {secret}"] * 3
