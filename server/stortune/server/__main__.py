from stortune.server.cli import main

raise SystemExit(main())
