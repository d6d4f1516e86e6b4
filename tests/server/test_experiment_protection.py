"""Issue 26, points 6 and 10 on the control plane: an experiment aimed at a device the host lives
on (here a loop device holding /) is refused at submission and in its dry run, naming the device,
as the agent would refuse its first trial: before, both were accepted and the host was taken."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from stortune.schemas.topology import Mount
from tests.server.builders import API, loop_topology, registration
from tests.server.support import admin_client
from tests.server.tunefakes import experiment_doc

EXPERIMENTS = f"{API}/experiments"


def _register_root_on_loop0(app: FastAPI) -> None:
    topology = loop_topology("h1")
    topology.devices[0].mounts = [Mount(mountpoint="/", fstype="ext4", source="/dev/loop0", options=["rw"])]
    with admin_client(app) as client:
        body = registration("h1", topology=topology)
        assert client.post(f"{API}/agents/register", json=body).status_code == 200


@pytest.mark.parametrize("query", [{}, {"dryRun": "All"}], ids=["submission", "dry run"])
def test_hostile_an_experiment_on_the_device_holding_root_is_refused_naming_it(
        app: FastAPI, query: dict[str, str]) -> None:
    _register_root_on_loop0(app)
    with admin_client(app) as client:
        response = client.post(EXPERIMENTS, params=query, json=experiment_doc())
        assert response.status_code == 422, response.text
        causes = response.json()["details"]["causes"]
        assert [c["field"] for c in causes] == ["spec.target.device"]
        message = causes[0]["message"]
        assert "on host h1: loop0 holds /: a protected device, no experiment runs on it" in message
        assert "--protect-mount" in message
        assert client.get(EXPERIMENTS).json()["items"] == []


def test_an_experiment_on_a_device_that_holds_no_protected_mount_is_planned(app: FastAPI) -> None:
    with admin_client(app) as client:
        assert client.post(f"{API}/agents/register",
                           json=registration("h1", topology=loop_topology("h1"))).status_code == 200
        response = client.post(EXPERIMENTS, params={"dryRun": "All"}, json=experiment_doc())
        assert response.status_code == 200, response.text
        assert [h["device"] for h in response.json()["hosts"]] == ["loop0"]
