"""`python -m pgflow_gen.cli`: the `pgflow-gen` command."""

from pgflow_gen.cli.app import main

raise SystemExit(main())
