"""The bench area's commands, one module per command (or command group), named for it:
`bench/commands/<command>.py` defines the click command `<command>`, registered in bench/area.py as
"gpubox.bench.commands.<command>:<command>". They parse options and call the area's library
(docs/architecture.md, "How to add a command")."""
