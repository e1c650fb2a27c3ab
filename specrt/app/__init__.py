"""The application layer: what the `specrt` commands do around the decode core.

Loading by catalog name with convert-on-first-use (api.py), `specrt bench` and the compared systems (bench*.py,
compare/), the OpenAI-compatible server (serve/) and the chat terminal (chat_cli.py). The one part that may import
both convert/ and runtime/ (docs/architecture.md)."""
