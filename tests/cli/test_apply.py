"""stortune apply: GitOps directories in, kubectl-style lines out, nothing sent unless all is valid."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest

from stortune.cli import manifests, sync
from stortune.cli.client import JSON, Client, Conflict, Profile
from tests.cli.conftest import ControlPlane, Run, profile_yaml


def gitops_repo(root: Path) -> Path:
    """Profiles as a repository keeps them: multi-document files, a subdirectory, things to skip."""
    (root / "hosts" / "streaming").mkdir(parents=True)
    (root / "a-streaming.yaml").write_text(profile_yaml("vod") + "---\n" + profile_yaml(
        "vod-archive", selector="{matchLabels: {role: archive}}"))
    (root / "hosts" / "streaming" / "edge.yml").write_text(profile_yaml("edge", read_ahead_kb=1024))
    (root / "README.md").write_text("not a profile\n")
    (root / ".github").mkdir()
    (root / ".github" / "ci.yaml").write_text("on: push\n")  # hidden: not read, would be invalid
    return root


def test_apply_directory_creates_then_reports_unchanged_then_configured(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    repo = gitops_repo(tmp_path / "repo")

    first = stortune("apply", "-f", str(repo))
    assert first.code == 0, first.err
    # Sorted by path: a-streaming.yaml (two documents, in order), then hosts/streaming/edge.yml.
    assert first.out.splitlines() == ["storageprofile/vod created", "storageprofile/vod-archive created",
                                      "storageprofile/edge created"]
    stored = control_plane.profiles()
    assert sorted(stored) == ["edge", "vod", "vod-archive"]
    assert stored["vod"]["metadata"]["annotations"] == {"stortune.dev/managed-by": "stortune-apply"}

    again = stortune("apply", "-f", str(repo))
    assert again.code == 0
    assert again.out.splitlines() == [f"storageprofile/{n} unchanged" for n in ("vod", "vod-archive", "edge")]
    assert control_plane.profiles()["vod"]["metadata"]["resourceVersion"] == stored["vod"]["metadata"][
        "resourceVersion"]

    (repo / "hosts" / "streaming" / "edge.yml").write_text(profile_yaml("edge", read_ahead_kb=2048))
    changed = stortune("apply", "-f", str(repo))
    assert changed.code == 0
    assert "storageprofile/edge configured" in changed.out.splitlines()
    assert "storageprofile/vod unchanged" in changed.out.splitlines()
    edge = control_plane.profiles()["edge"]
    assert edge["metadata"]["generation"] == 2
    assert edge["spec"]["rules"][0]["settings"] == {"read_ahead_kb": 2048}


def test_a_label_change_is_configured_without_a_new_generation(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml("vod"))
    assert stortune("apply", "-f", str(path)).code == 0
    path.write_text(profile_yaml("vod", labels="{team: media}"))
    result = stortune("apply", "-f", str(path))
    assert result.out.strip() == "storageprofile/vod configured"
    vod = control_plane.profiles()["vod"]
    assert vod["metadata"]["labels"] == {"team": "media"}
    assert vod["metadata"]["generation"] == 1


def test_one_invalid_document_refuses_everything_and_names_the_field(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    repo = gitops_repo(tmp_path / "repo")
    (repo / "z-broken.yaml").write_text(profile_yaml("broken", read_ahead_kb=5))
    (repo / "z-unselective.yaml").write_text(
        profile_yaml("everywhere").replace("  hostSelector: {matchLabels: {role: streamer}}\n", ""))

    result = stortune("apply", "-f", str(repo))
    assert result.code == 1
    assert result.out == ""
    assert "nothing was sent" in result.err
    assert "z-broken.yaml (StorageProfile/broken): spec.rules[0].settings.read_ahead_kb: must be a " \
           "multiple of 4" in result.err
    assert "z-unselective.yaml (StorageProfile/everywhere): spec.hostSelector: required" in result.err
    assert control_plane.profiles() == {}


def test_server_side_refusal_prints_the_field_paths_of_the_status_causes(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    # Valid as a document, but a NUL is text no database stores: only the server refuses it (422).
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml("vod", extra_metadata='annotations: {note: "a\\0b"}'))
    result = stortune("apply", "-f", str(path))
    assert result.code == 1
    assert "storageprofile/vod: refused by the control plane as invalid:" in result.err
    assert "  metadata.annotations.note: contains a NUL character" in result.err
    assert control_plane.profiles() == {}


def test_dry_run_stores_nothing_and_prints_each_hosts_plan(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    control_plane.register("web-1", {"role": "streamer"})
    control_plane.register("web-2", {"role": "streamer"}, topology=False)
    control_plane.register("db-1", {"role": "database"})
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml("vod"))

    result = stortune("apply", "-f", str(path), "--dry-run")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == "storageprofile/vod created (dry run)"
    assert "host/web-1: 1 change(s)" in lines
    assert "host/web-2: topology not reported yet; nothing to plan" in lines
    assert not any("db-1" in line for line in lines)  # not selected
    change = next(line for line in lines if "read_ahead_kb" in line)
    assert change.split() == ["sda", "read_ahead_kb", "128", "->", "4096", "vod/raid-volumes"]
    assert control_plane.profiles() == {}

    assert stortune("apply", "-f", str(path)).code == 0
    path.write_text(profile_yaml("vod", read_ahead_kb=8192))
    result = stortune("apply", "-f", str(path), "--dry-run")
    assert result.out.splitlines()[0] == "storageprofile/vod configured (dry run)"
    assert "128 -> 8192" in result.out
    stored = control_plane.profiles()["vod"]
    assert stored["metadata"]["generation"] == 1
    assert stored["spec"]["rules"][0]["settings"] == {"read_ahead_kb": 4096}


def test_dry_run_plan_counts_a_rejection(stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> None:
    control_plane.register("web-1", {"role": "streamer"})
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml("vod").replace("{read_ahead_kb: 4096}", "{scheduler: bfq}"))
    result = stortune("apply", "-f", str(path), "--dry-run")
    assert result.code == 1  # an error in the plan
    assert "1 rejection(s)" in result.out
    row = next(line for line in result.out.splitlines() if "bfq" in line)
    assert "scheduler" in row
    assert "error: not set" in row


def test_prune_deletes_only_managed_profiles_absent_from_the_files(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    with control_plane.http() as http:  # made by hand (no managed-by annotation): never pruned
        created = http.post("/profiles", content=profile_yaml("handmade"),
                            headers={"content-type": "application/yaml"})
        assert created.status_code == 201, created.text
    keep, gone = tmp_path / "keep.yaml", tmp_path / "gone.yaml"
    keep.write_text(profile_yaml("keep"))
    gone.write_text(profile_yaml("gone"))
    assert stortune("apply", "-f", str(keep), "-f", str(gone)).code == 0

    preview = stortune("apply", "-f", str(keep), "--prune", "--dry-run")
    assert preview.code == 0
    assert "storageprofile/gone pruned (dry run)" in preview.out.splitlines()
    assert sorted(control_plane.profiles()) == ["gone", "handmade", "keep"]

    result = stortune("apply", "-f", str(keep), "--prune")
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["storageprofile/keep unchanged", "storageprofile/gone pruned"]
    assert sorted(control_plane.profiles()) == ["handmade", "keep"]


def test_without_prune_absent_profiles_stay(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(profile_yaml("a"))
    b.write_text(profile_yaml("b"))
    assert stortune("apply", "-f", str(a), "-f", str(b)).code == 0
    assert stortune("apply", "-f", str(a)).code == 0
    assert sorted(control_plane.profiles()) == ["a", "b"]


def test_apply_reads_stdin(
    stortune: Run, control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(profile_yaml("from-stdin")))
    result = stortune("apply", "-f", "-")
    assert result.out.strip() == "storageprofile/from-stdin created"
    assert list(control_plane.profiles()) == ["from-stdin"]


def test_get_yaml_output_applies_back_unchanged(stortune: Run, tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml("vod"))
    assert stortune("apply", "-f", str(path)).code == 0
    exported = tmp_path / "exported.yaml"
    exported.write_text(stortune("get", "profile", "vod", "-o", "yaml").out)
    result = stortune("apply", "-f", str(exported))
    assert result.code == 0, result.err
    assert result.out.strip() == "storageprofile/vod unchanged"


class RacingClient(Client):
    """Another writer changes the profile between our read and our write, ``races`` times."""

    def __init__(self, server: str, token: str, races: int) -> None:
        super().__init__(server, token=token)
        self.races = races

    def replace_profile(self, name: str, document: JSON) -> Profile:
        if self.races:
            self.races -= 1
            current = self.get_profile(name).raw
            current["metadata"]["labels"] = {"touched": str(self.races)}
            with httpx.Client(base_url=self.server, headers=self._http.headers) as other:
                assert other.put(f"/api/v1/profiles/{name}", json=current).status_code == 200
        return super().replace_profile(name, document)


def test_a_conflict_is_retried_once_on_a_fresh_read(control_plane: ControlPlane, tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(profile_yaml("vod"))
    (doc,) = manifests.read([str(path)])
    with Client(control_plane.url, token=control_plane.admin_token) as client:
        sync.apply(client, doc, dry_run=False)
    path.write_text(profile_yaml("vod", read_ahead_kb=8192))
    (changed,) = manifests.read([str(path)])

    with RacingClient(control_plane.url, control_plane.admin_token, races=1) as client:
        assert sync.apply(client, changed, dry_run=False).action == "configured"
    stored = control_plane.profiles()["vod"]
    assert stored["spec"]["rules"][0]["settings"] == {"read_ahead_kb": 8192}
    assert stored["metadata"]["labels"] == {}  # our write, made on the fresh read, won

    path.write_text(profile_yaml("vod", read_ahead_kb=4096))
    (again,) = manifests.read([str(path)])
    racing = RacingClient(control_plane.url, control_plane.admin_token, races=2)
    with racing as client, pytest.raises(Conflict) as caught:
        sync.apply(client, again, dry_run=False)
    assert "the object has been modified" in caught.value.message


def _with_model(name: str, model: str) -> str:
    text = profile_yaml(name)
    return text.replace("match: {kind: [disk], rotational: true}",
                        f"match: {{kind: [disk], rotational: true, model: '{model}'}}")


@pytest.mark.parametrize("command", ["apply", "diff"])
def test_a_pattern_that_cannot_run_is_a_clean_error_naming_the_field(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path, command: str,
) -> None:
    """Hostile: 1,000 open parentheses were a RecursionError traceback; a backreference was
    accepted (and could backtrack for ever). Both are named, and nothing is sent."""
    (tmp_path / "a.yaml").write_text(_with_model("parens", "(" * 1000))
    (tmp_path / "b.yaml").write_text(_with_model("backref", r"(\w)\1"))
    (tmp_path / "c.yaml").write_text(_with_model("fine", "PERC.*"))
    result = stortune(command, "-f", str(tmp_path))
    assert result.code == 1
    assert "Traceback" not in result.err and result.out == ""
    assert "nothing was sent" in result.err
    assert "a.yaml (StorageProfile/parens): spec.rules[0].match.model: the regular expression has 1000" \
           " characters; at most 256" in result.err
    assert "b.yaml (StorageProfile/backref): spec.rules[0].match.model: not a regular expression RE2 can" \
           " run: invalid escape sequence: \\1" in result.err
    assert control_plane.profiles() == {}
