"""`specrt bench --compare`: the systems users would pick instead of specrt, run beside it on the same prompts.

systems.py names them (registry SYSTEMS), environment.py installs each into its own environment in the cache,
workers/ holds the standalone scripts that run inside those environments, worker_client.py talks to them."""
