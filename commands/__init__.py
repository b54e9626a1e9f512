"""The command layer: one module per subcommand, above probes, conformance, runners and mrcheck
(docs/architecture.md)."""
