from dtprof.cli import main

raise SystemExit(main())
