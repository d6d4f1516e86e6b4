"""stortune-server: run the control plane."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from stortune.server.app import create_app
from stortune.server.settings import DEFAULT_LISTEN, DEFAULT_STATE_DIR, Settings, default_db_url


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stortune-server", description="The stortune control plane.")
    parser.add_argument("--db", metavar="URL",
                        help="SQLAlchemy URL: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB "
                             "(default: sqlite in --state-dir)")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"where the default SQLite database lives (default {DEFAULT_STATE_DIR})")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"address to serve on (default {DEFAULT_LISTEN})")
    parser.add_argument("--reconcile-interval", type=float, default=30, metavar="SECONDS")
    parser.add_argument("--lease-duration", type=float, default=15, metavar="SECONDS")
    parser.add_argument("--heartbeat-interval", type=float, default=5, metavar="SECONDS")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    db_url = args.db
    if db_url is None:
        args.state_dir.mkdir(parents=True, exist_ok=True)
        db_url = default_db_url(args.state_dir)
    try:
        settings = Settings(
            db_url=db_url, listen=args.listen, reconcile_interval_s=args.reconcile_interval,
            lease_duration_s=args.lease_duration, heartbeat_interval_s=args.heartbeat_interval,
        )
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            where = ".".join(str(p) for p in err["loc"])
            print(f"stortune-server: {where + ': ' if where else ''}{err['msg']}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    host, port = settings.host_port
    uvicorn.run(app, host=host, port=port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
