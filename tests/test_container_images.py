"""deploy/container: the image recipes cannot be built here (no registry), so they are read.

Each instruction is one the builders know, every COPY source is in the repository,
the entrypoint is a console script the package declares and its default arguments
parse, the server drops root, and the agent image adds only the tools the agent runs.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass

import pytest
import yaml

from tests.deployfiles import DEPLOY, ROOT, parse_command

CONTAINER = DEPLOY / "container"
KNOWN = {"FROM", "ARG", "RUN", "COPY", "ADD", "WORKDIR", "USER", "ENV", "EXPOSE", "ENTRYPOINT", "CMD",
         "LABEL", "VOLUME", "HEALTHCHECK", "SHELL", "STOPSIGNAL", "ONBUILD"}
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@dataclass(frozen=True)
class Instruction:
    keyword: str
    rest: str


def instructions(name: str) -> list[Instruction]:
    """The file's instructions, continuation lines joined and comments dropped."""
    out: list[Instruction] = []
    pending = ""
    for line in (CONTAINER / name).read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            keyword, _, rest = pending.strip().partition(" ")
            out.append(Instruction(keyword, rest.strip()))
            pending = ""
    assert not pending, f"{name} ends inside a continued line"
    return out


def final_stage(items: list[Instruction]) -> list[Instruction]:
    last = max(i for i, item in enumerate(items) if item.keyword == "FROM")
    return items[last:]


def apt_packages(stage: list[Instruction]) -> set[str]:
    found: set[str] = set()
    for item in stage:
        if item.keyword == "RUN":
            for command in re.split(r"&&|;", item.rest):
                words = shlex.split(command)
                if words[:2] == ["apt-get", "install"]:
                    found |= {w for w in words[2:] if not w.startswith("-")}
    return found


def pip_installs(stage: list[Instruction]) -> list[str]:
    """What the stage's `pip install` commands install ("$(echo X)" read as X)."""
    found: list[str] = []
    for item in stage:
        if item.keyword == "RUN":
            for command in re.split(r"&&|;", item.rest):
                words = shlex.split(re.sub(r"\$\(echo ([^)]*)\)", r"\1", command))
                if words[:2] == ["pip", "install"]:
                    found += [w for w in words[2:] if not w.startswith("-")]
    return found


IMAGES = {"Containerfile.server": "stortune-server", "Containerfile.agent": "stortune-agent"}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_recipe_is_well_formed(name: str) -> None:
    items = instructions(name)
    assert {i.keyword for i in items} <= KNOWN, f"{name}: unknown instruction"
    stages = [i.rest.split() for i in items if i.keyword == "FROM"]
    assert len(stages) >= 2, "multi-stage: the wheel is built apart from the image"
    named = {words[2] for words in stages if len(words) == 3 and words[1].upper() == "AS"}
    for item in items:
        if item.keyword in ("COPY", "ADD"):
            words = item.rest.split()
            flags = [w for w in words if w.startswith("--")]
            sources = [w for w in words if not w.startswith("--")][:-1]
            if any(f.startswith("--from=") for f in flags):
                assert {f.removeprefix("--from=") for f in flags} <= named
                continue
            for source in sources:
                assert (ROOT / source).exists(), f"{name}: COPY {source}: not in the repository"


@pytest.mark.parametrize(("name", "tool"), sorted(IMAGES.items()))
def test_the_entrypoint_is_a_declared_console_script(name: str, tool: str) -> None:
    stage = final_stage(instructions(name))
    (entrypoint,) = [json.loads(i.rest) for i in stage if i.keyword == "ENTRYPOINT"]
    (cmd,) = [json.loads(i.rest) for i in stage if i.keyword == "CMD"]
    assert entrypoint == [tool] and tool in SCRIPTS
    parse_command(tool, cmd)


def test_the_server_image_drops_root_as_the_manifests_expect() -> None:
    stage = final_stage(instructions("Containerfile.server"))
    (user,) = [i.rest for i in stage if i.keyword == "USER"]
    uid = user.partition(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric, so runAsNonRoot can check it"
    pod = yaml.safe_load((DEPLOY / "kubernetes" / "server-deployment.yaml").read_text())
    assert pod["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)
    assert apt_packages(stage) == set(), "the control plane runs no system tools"
    assert pip_installs(stage) == ["/tmp/dist/*.whl[server]"]


def test_the_agent_image_adds_only_the_tools_the_agent_runs() -> None:
    stage = final_stage(instructions("Containerfile.agent"))
    assert not [i for i in stage if i.keyword == "USER"], "the agent runs as root"
    assert apt_packages(stage) == {"fio", "util-linux"}
    assert pip_installs(stage) == ["/tmp/dist/*.whl"], "the bare wheel: no server or CLI extra"
    assert any("rm -rf /var/lib/apt/lists" in i.rest for i in stage if i.keyword == "RUN")
