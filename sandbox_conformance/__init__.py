"""sandbox-conformance: the one name this project installs (issue 30).

The packages live at the top of the checkout, where the design puts them (`probes/`,
`conformance/`, `runners/`, ...); each entry here is a relative symlink to one of them, so the
checkout, an editable install, a wheel (setuptools copies through the links) and mypy all see the
same `sandbox_conformance.<package>` names, and nothing of ours lands beside a user's own
`conformance/` or `commands/`."""
