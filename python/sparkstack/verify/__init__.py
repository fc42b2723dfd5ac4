"""`sparkstack verify URL`: prove a served OpenAI-compatible vLLM endpoint does what the stack needs.

checks.py holds the checks as data (required or warn-only) with their probes; run.py plans (pure) and runs them,
returning frozen results; command.py is the command object. Nothing is imported here, so that a command which
only declares verify's options (bench, up) does not load the HTTP client with them."""
