from pcpcheck.cli import main

raise SystemExit(main())
