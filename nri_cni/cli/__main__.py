"""`python -m nri_cni.cli`: the `nri-cni` command."""

import sys

from nri_cni.cli.main import main

sys.exit(main())
