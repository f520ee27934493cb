"""`python -m nri_cni`: the `nri-cni` command."""

import sys

from nri_cni.cli.main import main

sys.exit(main())
