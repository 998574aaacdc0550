"""Stand-ins for commands that cannot exist here; one module per command, `main(sim, argv) -> rc`."""
