from stortune.cli.main import main

raise SystemExit(main())
