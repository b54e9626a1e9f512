"""The driver: decide where the witness suite may run, run it there, or refuse."""
