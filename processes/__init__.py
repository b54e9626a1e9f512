"""Running children, stopping them, and cleaning up after them: the floor every other package stands on.

A child with a timeout whose whole process group is killed (`children`), how it ended (`child_exit`), the
stop signal at any moment (`cancel`), the guardian that outlives a SIGKILLed run (`guardian`), the
ledger of what we killed (`kills`), whose leftovers are whose and the sweep (`owner`), and the
exit-code contract with the files a command reads and writes (`exits`, `inputs`, `outputs`).
Nothing here knows a probe, a witness or a mode."""
