"""The wheel installs into a fresh venv with only `stortune` at the top level,
and its console scripts run there: bare, the agent alone (the others name their
extra); with the `server` and `cli` extras, all of them."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


DOCS_PROBE = """
import sys
from fastapi.testclient import TestClient
from stortune.server import Settings, create_app
from stortune.server.api.docs import ASSETS
client = TestClient(create_app(Settings(db_url="sqlite:///" + sys.argv[1])))
for path in ["/docs", "/redoc", *("/docs/assets/" + name for name in ASSETS)]:
    print(client.get(path).status_code)
"""


@pytest.mark.slow(seconds=45)
def test_wheel_installs_and_runs_in_a_fresh_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(dist), str(ROOT)], check=True, capture_output=True)
    (wheel,) = dist.glob("stortune-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        tops = {n.split("/")[0] for n in zf.namelist()}
    assert tops == {"stortune", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
                    + ".dist-info"}, tops

    env_dir = tmp_path / "venv"
    # --system-site-packages would hide a missing dependency; a clean venv proves the metadata.
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True, timeout=600)
    # Bare: a storage host's install. The agent runs; the control plane's stack is absent.
    agent = env_dir / "bin" / "stortune-agent"
    out = subprocess.run([str(agent), "topology", "-o", "json"], check=True, capture_output=True,
                         text=True, cwd=tmp_path)
    assert '"devices"' in out.stdout
    absent = subprocess.run([str(py), "-c", "import importlib.util as u; print([m for m in ('fastapi',"
                             "'sqlalchemy','psycopg','matplotlib','optuna','httpx') if u.find_spec(m)])"],
                            check=True, capture_output=True, text=True, cwd=tmp_path)
    assert absent.stdout.strip() == "[]"
    for script, extra in (("stortune-server", "server"), ("stortune", "cli")):
        out = subprocess.run([str(env_dir / "bin" / script), "--help"], capture_output=True, text=True,
                             check=False)
        assert out.returncode == 1 and f"pip install 'stortune[{extra}]'" in out.stderr, out.stderr
    subprocess.run([*pip, f"{wheel}[server,cli]"], check=True, capture_output=True, timeout=600)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    for bare in ("server", "agent", "schemas", "proto", "tests"):
        assert not (Path(site) / bare).exists(), f"wheel installs a bare top-level {bare!r}"
    probe = subprocess.run(
        [str(py), "-c", "import importlib.util as u; print([m for m in ('agent','schemas','server')"
                        " if u.find_spec(m)])"],
        check=True, capture_output=True, text=True, cwd=tmp_path)
    assert probe.stdout.strip() == "[]"

    for script in ("stortune", "stortune-server"):
        out = subprocess.run([str(env_dir / "bin" / script), "--help"], check=True,
                             capture_output=True, text=True)
        assert "usage:" in out.stdout

    # /docs and /redoc serve their scripts from the installed wheel's dependencies, not a CDN
    docs = subprocess.run([str(py), "-c", DOCS_PROBE, str(tmp_path / "docs.db")], capture_output=True,
                          text=True, cwd=tmp_path, check=False)
    assert docs.returncode == 0, docs.stderr
    assert docs.stdout.split() == ["200"] * 6, docs.stdout

    out = subprocess.run([str(agent), "--help"], check=True, capture_output=True, text=True)
    assert "topology" in out.stdout
    out = subprocess.run([str(agent), "topology", "-o", "json"], check=True, capture_output=True,
                         text=True, cwd=tmp_path)
    assert '"devices"' in out.stdout
