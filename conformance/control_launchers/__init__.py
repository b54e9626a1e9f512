"""External launchers for the negative controls (conformance/controls.py): the reference sandbox with
one thing changed that conformance/bwrap_argv.py has no perturbation for."""
