"""``python -m deployments.cli``: the ``insitu`` command."""

from deployments.cli import main

main()
