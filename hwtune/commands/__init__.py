"""The hwtune area's commands, one module per command (or command group), named for it:
`hwtune/commands/<command>.py` defines the click command `<command>`, registered in hwtune/area.py as
"gpubox.hwtune.commands.<command>:<command>". They parse options and call the area's library
(docs/architecture.md, "How to add a command")."""
